package tpm_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// TestSignWithoutRevocationCounter: root with owner authorization deletes
// a revocable key's counter, or deletes and defines it again without
// incrementing it. The key must not sign (PolicyNV has nothing to check),
// and the error must say so — the revocation counter is gone, a policy
// failure — not that the TPM lost the loaded key, which sends the
// operator after the wrong problem and makes every signature drop and
// reload its connection.
func TestSignWithoutRevocationCounter(t *testing.T) {
	for _, redefine := range []bool{false, true} {
		t.Run(fmt.Sprintf("redefined=%v", redefine), func(t *testing.T) {
			f := newRevocableFixture(t, tpmpolicy.DefaultRevocationIndex)
			s := f.generate(t)
			f.approve(t, "current", epochOf(t, s))
			mustSign(t, s)
			undefineCounter(t, f, tpmpolicy.DefaultRevocationIndex, redefine)
			err := sign(s)
			if err == nil {
				t.Fatal("signed without a written revocation counter")
			}
			if !errors.Is(err, signer.ErrPolicyNotSatisfied) || errors.Is(err, signer.ErrDeviceUnavailable) || !strings.Contains(err.Error(), "revocation counter") {
				t.Errorf("sign without the counter = %v; want a policy failure naming the revocation counter, not an unavailable device", err)
			}
		})
	}
}

// undefineCounter deletes the counter (TPM2_NV_UndefineSpace) and, with
// redefine, defines it again with no value.
func undefineCounter(t *testing.T, f *revocableFixture, idx tpm2.TPMHandle, redefine bool) {
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
	if !redefine {
		return
	}
	if _, err := (tpm2.NVDefineSpace{AuthHandle: owner, PublicInfo: tpm2.New2B(tpmpolicy.RevocationCounterPublic(idx, false))}).Execute(c); err != nil {
		t.Fatal(err)
	}
}
