package tpm_test

import (
	"testing"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// BenchmarkSimulatorSignAuthorized is BenchmarkSimulatorSign for a key
// under a policy authority: the steady state is PolicyPCR,
// PolicyAuthorize (cached ticket), PolicyCommandCode and Sign.
func BenchmarkSimulatorSignAuthorized(b *testing.B) {
	auth := newP256(b)
	f := newAuthorizedFixture(b, auth)
	f.approve(b, auth, "bench")
	benchSign(b, f.b, f.uri, signer.ECDSAP256)
}

// BenchmarkSwtpmSignAuthorized is the same on swtpm through its relay.
func BenchmarkSwtpmSignAuthorized(b *testing.B) {
	auth := newP256(b)
	f := newAuthorizedFixture(b, auth)
	sw := tpmsim.StartSwtpm(b, tpmsim.SwtpmOptions{})
	f.b.Dial = sw.Dial
	f.approve(b, auth, "bench")
	benchSign(b, f.b, f.uri, signer.ECDSAP256)
}
