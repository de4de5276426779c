package server

import (
	"testing"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"

	"github.com/steward-trustd/steward-trustd/signer"
)

// BenchmarkCertificateHandler measures the handler alone (token, CSR
// parse and verify, policy, issuance with a P-256 file key, audit line),
// without gRPC or TLS: the daemon's own cost per certificate.
func BenchmarkCertificateHandler(b *testing.B) {
	ca := newTestCA(b, signer.ECDSAP256)
	svc, err := New(Config{Signer: ca.signer, Credentials: ca.credentials(b, testToken), RateLimits: RateLimits{PerPeerRate: -1}})
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
}
