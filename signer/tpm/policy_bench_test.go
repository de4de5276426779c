package tpm_test

import (
	"crypto"
	"crypto/sha256"
	"testing"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// BenchmarkSimulatorSignAuthorized is BenchmarkSimulatorSign for a key
// under a policy authority: the steady state is PolicyPCR,
// PolicyAuthorize (cached ticket), PolicyCommandCode and Sign.
func BenchmarkSimulatorSignAuthorized(b *testing.B) {
	auth := newP256(b)
	f := newAuthorizedFixture(b, auth)
	f.approve(b, auth, "bench")
	benchSign(b, f.b, f.uri)
}

// BenchmarkSwtpmSignAuthorized is the same on swtpm through its relay.
func BenchmarkSwtpmSignAuthorized(b *testing.B) {
	auth := newP256(b)
	f := newAuthorizedFixture(b, auth)
	sw := tpmsim.StartSwtpm(b, tpmsim.SwtpmOptions{})
	f.b.Dial = sw.Dial
	f.approve(b, auth, "bench")
	benchSign(b, f.b, f.uri)
}

func benchSign(b *testing.B, be *tpm.Backend, uri string) {
	be.ApprovalsReload = 0 // the default: the directory is re-read at most once a second
	s, err := be.Generate(ctx, uri, signer.ECDSAP256)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	d := sha256.Sum256([]byte("bench"))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.Sign(nil, d[:], crypto.SHA256); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "sig/s")
}
