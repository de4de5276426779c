package tpm_test

import (
	"crypto"
	"crypto/sha256"
	"path/filepath"
	"testing"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// BenchmarkSwtpmSign measures raw TPM signatures (policy session with
// PolicyPCR + PolicyCommandCode, TPM2_Sign, flush: 5 TPM commands) on a real
// swtpm, straight on its socket and through the tpmsim relay.
func BenchmarkSwtpmSign(b *testing.B) {
	for _, c := range []struct {
		name  string
		relay bool
		alg   signer.Algorithm
	}{{"p256-direct", false, signer.ECDSAP256}, {"p256-relay", true, signer.ECDSAP256}, {"p384-direct", false, signer.ECDSAP384}} {
		b.Run(c.name, func(b *testing.B) {
			sw := tpmsim.StartSwtpm(b, tpmsim.SwtpmOptions{})
			attrs := "socket=" + sw.RawSocket()
			if c.relay {
				attrs = sw.URIAttrs()
			}
			benchSign(b, &tpm.Backend{Dial: tpmsim.Dial}, "tpm:path="+filepath.Join(b.TempDir(), "k")+";"+attrs+";pcrs=7,11", c.alg)
		})
	}
}

// BenchmarkSimulatorSign is the same on the in-process simulator.
func BenchmarkSimulatorSign(b *testing.B) {
	sim := tpmsim.NewSimulator(b)
	benchSign(b, &tpm.Backend{Dial: sim.Dial}, "tpm:path="+filepath.Join(b.TempDir(), "k")+";socket=/x", signer.ECDSAP256)
}

// benchSign creates a key at uri and signs with it b.N times.
func benchSign(b *testing.B, be *tpm.Backend, uri string, alg signer.Algorithm) {
	be.ApprovalsReload = 0 // the default: an approvals directory is re-read at most once a second
	s, err := be.Generate(ctx, uri, alg)
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
