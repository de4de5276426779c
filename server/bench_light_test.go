package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/steward-trustd/steward-trustd/signer"
)

// lightClients is the number of kept-alive connections of the light
// client (test/load -light's default).
const lightClients = 32

// BenchmarkLightClients is the daemon's file path as test/load -light
// drives it, in one process so that go test -cpuprofile/-memprofile
// profile it: a FrontDoor with metrics and a JSON audit log, 32
// kept-alive TLS connections, CSRs made before the clock starts. The
// profile holds the client's side too (grpc client, TLS), which the
// daemon does not pay.
//
//	go test -run XXX -bench LightClients -benchtime 3000x -cpuprofile cpu.out ./server
func BenchmarkLightClients(b *testing.B) {
	addr, roots := startLightFront(b)
	conns := dialLight(b, addr, roots)
	csrs := make([][]byte, b.N)
	for i := range csrs {
		csrs[i] = makeCSR(b, csrSpec{key: newKey(b, "p256"), dns: []string{fmt.Sprintf("worker-%d", i)}})
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "token", testToken)
	var next atomic.Int64
	var failed atomic.Value
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for _, cc := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			api := securityapi.NewSecurityServiceClient(cc)
			for i := next.Add(1) - 1; i < int64(b.N); i = next.Add(1) - 1 {
				if _, err := api.Certificate(ctx, &securityapi.CertificateRequest{Csr: csrs[i]}); err != nil {
					failed.Store(err)
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
}

// startLightFront serves a file-key Service as the daemon does (FrontDoor,
// metrics, JSON audit and log lines to io.Discard) until b ends.
func startLightFront(b *testing.B) (string, *x509.CertPool) {
	b.Helper()
	ca := newTestCA(b, signer.ECDSAP256)
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	svc, err := New(Config{Signer: ca.signer, Credentials: ca.credentials(b, testToken), Logger: log, Audit: log.With("log", "audit"),
		Metrics: NewMetrics(prometheus.NewRegistry(), "file", true), RateLimits: RateLimits{PerPeerRate: -1}})
	if err != nil {
		b.Fatal(err)
	}
	holder := &CertHolder{}
	si := &SelfIssuer{Holder: holder, Signer: ca.signer, CA: func() *x509.Certificate { return ca.cert },
		Hosts: func() ([]string, error) { return []string{"127.0.0.1"}, nil }}
	if err := si.Issue(); err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	f := NewFrontDoor(FrontDoorConfig{Listener: ln, Service: svc, TLS: TLSConfig(holder.GetCertificate), ShutdownGrace: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		<-done
	})
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	return ln.Addr().String(), roots
}

// dialLight opens the light client's connections and makes one request
// on each, so TLS and HTTP/2 setup fall outside the measurement.
func dialLight(b *testing.B, addr string, roots *x509.CertPool) []*grpc.ClientConn {
	b.Helper()
	creds := credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
	ctx := metadata.AppendToOutgoingContext(context.Background(), "token", testToken)
	conns := make([]*grpc.ClientConn, lightClients)
	for i := range conns {
		cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		csr := makeCSR(b, csrSpec{key: newKey(b, "p256"), dns: []string{"warm-up"}})
		if _, err := securityapi.NewSecurityServiceClient(cc).Certificate(ctx, &securityapi.CertificateRequest{Csr: csr}); err != nil {
			b.Fatal(err)
		}
		conns[i] = cc
	}
	return conns
}
