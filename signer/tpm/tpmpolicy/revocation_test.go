package tpmpolicy

import (
	"encoding/hex"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"
)

func mustRevocable(t *testing.T, idx tpm2.TPMHandle, pcrs ...int) Binding {
	t.Helper()
	b, err := RevocableBinding(pcrs, idx)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRevocableBindingRefs: the r1 ref names the selection and the
// counter's index, fits 32 bytes, decodes back, round-trips through a
// key blob; indices outside the owner range and malformed refs are refused.
func TestRevocableBindingRefs(t *testing.T) {
	b := mustRevocable(t, DefaultRevocationIndex, 7, 11)
	if b.Ref() != "steward-trustd/r1:000880:005354" || len(b.Ref()) > 32 || b.Mode() != "r1" || !b.Revocable() {
		t.Fatalf("RevocableBinding = %q (%s)", b.Ref(), b.Mode())
	}
	back, err := bindingOfRef(b.Ref())
	if err != nil || !back.Revocable() || back.RevocationIndex() != DefaultRevocationIndex || !slices.Equal(back.PCRs(), []int{7, 11}) {
		t.Fatalf("bindingOfRef(%q) = %v, %v", b.Ref(), back, err)
	}
	checkBlobRoundTrip(t, b, 2)
	for _, idx := range []tpm2.TPMHandle{0x00FFFFFF, 0x01C00002, 0x81000001} {
		if _, err := RevocableBinding([]int{7}, idx); err == nil {
			t.Errorf("RevocableBinding(0x%08x) accepted", uint32(idx))
		}
	}
	for _, ref := range []string{"steward-trustd/r1:000080", "steward-trustd/r1:000080:C00002", "steward-trustd/r1:010080:005354", "steward-trustd/r1:000080:00535", "steward-trustd/r1:000080:005354:"} {
		if b, err := bindingOfRef(ref); err == nil {
			t.Errorf("bindingOfRef(%q) = %v, want an error", ref, b)
		}
	}
}

// TestEpochPolicyDigestMatchesCalculator: the hand-computed PolicyNV
// extension equals go-tpm's PolicyCalculator from the zero digest.
func TestEpochPolicyDigestMatchesCalculator(t *testing.T) {
	b := mustRevocable(t, DefaultRevocationIndex, 7)
	name, err := RevocationCounterName(DefaultRevocationIndex)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := tpm2.NewPolicyCalculator(tpm2.TPMAlgSHA256)
	if err != nil {
		t.Fatal(err)
	}
	if err := EpochPolicy(0, DefaultRevocationIndex, name, 42).Update(pc); err != nil {
		t.Fatal(err)
	}
	got, err := EpochPolicyDigest(make([]byte, 32), b, 42)
	if err != nil || hex.EncodeToString(got) != hex.EncodeToString(pc.Hash().Digest) {
		t.Fatalf("EpochPolicyDigest = %x, %v; calculator %x", got, err, pc.Hash().Digest)
	}
	if _, err := EpochPolicyDigest(make([]byte, 32), mustBinding(t, 7), 42); err == nil {
		t.Error("an epoch policy for a non-revocable key was computed")
	}
}

// TestRevocableApprovals: an approval of a revocable key carries its
// epoch and PolicyPCR digest and verifies; one without an epoch, with an
// edited epoch or pcrPol, an epoch for a non-revocable key, or a plain v2
// approval of the same selection are refused.
func TestRevocableApprovals(t *testing.T) {
	auth := p256(t)
	auths := []*Authority{authority(t, auth)}
	b := mustRevocable(t, DefaultRevocationIndex, 7)
	vals := [][]byte{pcrValue(1)}
	if _, err := SignApproval(auth, b, []int{7}, vals, ApprovalMeta{}); err == nil || !strings.Contains(err.Error(), "revocation epoch") {
		t.Fatalf("approval of a revocable key without an epoch = %v", err)
	}
	if _, err := SignApproval(auth, mustBinding(t, 7), []int{7}, vals, ApprovalMeta{Epoch: 3}); err == nil {
		t.Fatal("an epoch for a v2 key was accepted")
	}
	a, err := SignApproval(auth, b, []int{7}, vals, ApprovalMeta{Epoch: 3, CreatedAt: time.Unix(0, 0)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := checkApproval(*a, auths, b)
	if err != nil || c.Epoch != 3 || hex.EncodeToString(c.PCRPol) != a.PCRPol || a.PCRPol == a.Pol {
		t.Fatalf("checkApproval = %+v, %v", c, err)
	}
	v2, err := SignApproval(auth, mustBinding(t, 7), []int{7}, vals, ApprovalMeta{})
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(x *Approval){
		"epoch raised":  func(x *Approval) { x.Epoch = 4 },
		"epoch dropped": func(x *Approval) { x.Epoch = 0 },
		"pcrPol edited": func(x *Approval) { x.PCRPol = v2.Pol[:62] + "00" },
		"pcrPol absent": func(x *Approval) { x.PCRPol = "" },
		"v2 approval":   func(x *Approval) { *x = *v2 },
	} {
		x := *a
		edit(&x)
		if _, err := checkApproval(x, auths, b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := checkApproval(*a, auths, mustBinding(t, 7)); err == nil {
		t.Error("a revocable approval was accepted for a v2 key")
	}
}
