package server

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"testing"
	"time"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"

	"github.com/steward-trustd/steward-trustd/signer"
)

// BenchmarkCertificateHandler measures the handler alone (token, CSR
// parse and verify, policy, signer gate, issuance with a P-256 file key
// and x509's check of the new signature, audit line), without gRPC or
// TLS: the daemon's own cost per certificate. "audit=json" writes the
// audit line as the daemon does (JSON, here to io.Discard).
func BenchmarkCertificateHandler(b *testing.B) {
	for _, bc := range []struct {
		name  string
		audit *slog.Logger
	}{
		{"audit=off", slog.New(slog.DiscardHandler)},
		{"audit=json", slog.New(slog.NewJSONHandler(io.Discard, nil)).With("log", "audit")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ca := newTestCA(b, signer.ECDSAP256)
			svc, err := New(Config{Signer: ca.signer, Credentials: ca.credentials(b, testToken), Audit: bc.audit, RateLimits: RateLimits{PerPeerRate: -1}})
			if err != nil {
				b.Fatal(err)
			}
			req := &securityapi.CertificateRequest{Csr: makeCSR(b, csrSpec{key: newKey(b, "p256"), dns: []string{"worker-1"}})}
			ctx := ctxFrom("10.0.0.1")
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := svc.Certificate(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLocalCPUBound is the work no server can skip per certificate,
// on one core: parse and verify the CSR, and x509.CreateCertificate, which
// signs with a P-256 file key and checks the new signature; no limits,
// lint, policy or audit. Two cores divided by it is the local CPU bound
// (test/load -cpu-bound measures the same on all cores).
func BenchmarkLocalCPUBound(b *testing.B) {
	ca := newTestCA(b, signer.ECDSAP256)
	csr := makeCSR(b, csrSpec{key: newKey(b, "p256"), dns: []string{"worker-1"}})
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		block, _ := pem.Decode(csr)
		req, err := x509.ParseCertificateRequest(block.Bytes)
		if err != nil || req.CheckSignature() != nil {
			b.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i) + 1), Subject: req.Subject, DNSNames: req.DNSNames,
			NotBefore: now, NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		if _, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, req.PublicKey, ca.signer); err != nil {
			b.Fatal(err)
		}
	}
}
