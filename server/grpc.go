package server

import (
	"crypto/rand"
	"crypto/tls"
	"io"
	"runtime"
	"time"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

// maxConnectionAge bounds a connection's life: a worker asks once per 12 h
// and opens a fresh connection per attempt.
const maxConnectionAge = 10 * time.Minute

// writeBufferSize holds an answer (certificate chain and CA bundle, a few
// KiB) with its HTTP/2 frames, so that one flush writes it.
const writeBufferSize = 16 << 10

// TLSConfig returns the server TLS configuration: TLS 1.2 or 1.3, Go's
// default curves and ciphers, no client certificate (workers authenticate
// with their token), certificates from getCert.
func TLSConfig(getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: getCert,
		ClientAuth:     tls.NoClientCert,
	}
}

// NewGRPCServer returns a gRPC server that serves svc over TLS only, with
// message size and connection bounds suited to CSRs from workers, and the
// default ConnLimits. The daemon serves through a FrontDoor, which adds
// the connection limits that need the connection listener.
func NewGRPCServer(svc *Service, tlsCfg *tls.Config, extra ...grpc.ServerOption) *grpc.Server {
	opts := append(serverOptions(svc, tlsCfg, ConnLimits{}.withDefaults()), extra...)
	g := grpc.NewServer(opts...)
	securityapi.RegisterSecurityServiceServer(g, svc)
	return g
}

// serverOptions are the options every server of svc gets: the
// panic-recovery interceptor first in the chain, then the bounds.
func serverOptions(svc *Service, tlsCfg *tls.Config, lim ConnLimits) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(recoverUnary(svc.log)),
		grpc.ChainStreamInterceptor(recoverStream(svc.log)),
		grpc.Creds(credentials.NewTLS(tlsCfg)),
		// A CSR is a few hundred bytes; the limit plus protobuf framing.
		grpc.MaxRecvMsgSize(svc.limits.MaxCSRBytes + 1024),
		grpc.MaxSendMsgSize(1 << 20),
		// Workers send a token and a handful of standard headers; without
		// this bound grpc-go accepts 16 MiB of metadata per stream from
		// anyone, token or not.
		grpc.MaxHeaderListSize(uint32(lim.MaxHeaderBytes)),
		// Requests and answers are a few KiB: no per-connection read
		// buffer (the framer reads the TLS connection directly, and TLS
		// buffers a record anyway) keeps a fleet power-up (thousands of
		// connections at once) cheaper (see the README). The write buffer
		// is shared (grpc-go v1.85's default, see grpc.SharedWriteBuffer:
		// taken from a pool for a flush and returned after it), so it costs
		// no idle memory; it
		// batches an answer's HEADERS, DATA and trailers into one TLS
		// record and one write(2) instead of three.
		grpc.ReadBufferSize(0),
		grpc.WriteBufferSize(writeBufferSize),
		grpc.InitialWindowSize(64 << 10),
		grpc.InitialConnWindowSize(64 << 10),
		// The connection listener enforces (and counts) the handshake timeout; gRPC's
		// own is the backstop for servers without one.
		grpc.ConnectionTimeout(lim.HandshakeTimeout + time.Second),
		grpc.MaxConcurrentStreams(16),
		// Reuse handler goroutines, whose stacks have grown to what the
		// CSR check and signing need, instead of a fresh one per request
		// (stack growth was ~4 % of the file path's CPU). Requests beyond
		// the pool still get their own goroutine.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			// A connection without a request in flight gets a GOAWAY this
			// soon (a served worker's, or one that never asked): a token
			// is no lease on a slot, and the GOAWAY lets a client's racing
			// request retry on a new connection instead of failing.
			MaxConnectionIdle:     min(lim.IdleTimeout, lim.RequestIdleTimeout),
			MaxConnectionAge:      maxConnectionAge,
			MaxConnectionAgeGrace: lim.MaxAgeGrace,
			Time:                  time.Minute,
			Timeout:               20 * time.Second,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 20 * time.Second}),
	}
}

func randOrDefault(r io.Reader) io.Reader {
	if r == nil {
		return rand.Reader
	}
	return r
}
