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
// message size and connection bounds suited to CSRs from workers.
func NewGRPCServer(svc *Service, tlsCfg *tls.Config, extra ...grpc.ServerOption) *grpc.Server {
	opts := []grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(tlsCfg)),
		// A CSR is a few hundred bytes; the limit plus protobuf framing.
		grpc.MaxRecvMsgSize(svc.limits.MaxCSRBytes + 1024),
		grpc.MaxSendMsgSize(1 << 20),
		// Requests and answers are a few KiB: small per-connection buffers
		// keep a fleet power-up (thousands of connections at once) from
		// costing ~100 KiB of memory per connection.
		grpc.ReadBufferSize(8 << 10),
		grpc.WriteBufferSize(8 << 10),
		grpc.InitialWindowSize(64 << 10),
		grpc.InitialConnWindowSize(64 << 10),
		grpc.SharedWriteBuffer(true),
		grpc.ConnectionTimeout(10 * time.Second),
		grpc.MaxConcurrentStreams(16),
		// Reuse handler goroutines, whose stacks have grown to what the
		// CSR check and signing need, instead of a fresh one per request
		// (stack growth was ~4 % of the file path's CPU). Requests beyond
		// the pool still get their own goroutine.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: 2 * time.Minute,
			MaxConnectionAge:  10 * time.Minute,
			Time:              time.Minute,
			Timeout:           20 * time.Second,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 20 * time.Second}),
	}
	opts = append(opts, extra...)
	g := grpc.NewServer(opts...)
	securityapi.RegisterSecurityServiceServer(g, svc)
	return g
}

func randOrDefault(r io.Reader) io.Reader {
	if r == nil {
		return rand.Reader
	}
	return r
}
