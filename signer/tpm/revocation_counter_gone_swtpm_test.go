package tpm_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// TestSignWithoutRevocationCounter: root with owner authorization deletes
// a revocable key's counter. The key must not sign (PolicyNV has nothing
// to check), and the error must say so — the revocation counter is gone,
// a policy failure — not that the TPM lost the loaded key, which sends
// the operator after the wrong problem and makes every signature drop and
// reload its connection.
func TestSignWithoutRevocationCounter(t *testing.T) {
	f := newRevocableFixture(t, tpmpolicy.DefaultRevocationIndex)
	s := f.generate(t)
	f.approve(t, "current", epochOf(t, s))
	mustSign(t, s)
	undefineCounter(t, f, tpmpolicy.DefaultRevocationIndex)
	err := sign(s)
	if err == nil {
		t.Fatal("signed with the revocation counter deleted")
	}
	if !errors.Is(err, signer.ErrPolicyNotSatisfied) || errors.Is(err, signer.ErrDeviceUnavailable) || !strings.Contains(err.Error(), "revocation counter") {
		t.Errorf("sign without the counter = %v; want a policy failure naming the revocation counter, not an unavailable device", err)
	}
}

func undefineCounter(t *testing.T, f *revocableFixture, idx tpm2.TPMHandle) {
	t.Helper()
	c, err := f.sw.Dial(ctx, f.sw.Device())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pub, err := tpm2.NVReadPublic{NVIndex: idx}.Execute(c)
	if err != nil {
		t.Fatal(err)
	}
	owner := tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)}
	if _, err := (tpm2.NVUndefineSpace{AuthHandle: owner, NVIndex: tpm2.NamedHandle{Handle: idx, Name: pub.NVName}}).Execute(c); err != nil {
		t.Fatal(err)
	}
}
