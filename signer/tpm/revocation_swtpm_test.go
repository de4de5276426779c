package tpm_test

import (
	"crypto"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// revocableFixture is a revocable key (revocation=) on a real swtpm.
type revocableFixture struct {
	sw        *tpmsim.Swtpm
	b         *tpm.Backend
	auth      crypto.Signer
	uri       string
	approvals string
	binding   tpmpolicy.Binding
}

func newRevocableFixture(t *testing.T, index tpm2.TPMHandle) *revocableFixture {
	t.Helper()
	f := &revocableFixture{sw: tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{}), auth: newP256(t)}
	f.b = &tpm.Backend{Dial: f.sw.Dial, ApprovalsReload: time.Nanosecond, RetryInterval: 10 * time.Millisecond}
	dir := t.TempDir()
	f.approvals = filepath.Join(dir, "approvals")
	if err := os.Mkdir(f.approvals, 0o755); err != nil {
		t.Fatal(err)
	}
	uri, err := tpm.WithAuthorities("tpm:path="+filepath.Join(dir, "ca.tpmkey")+";"+f.sw.URIAttrs()+";timeout=5s;approvals="+f.approvals, []crypto.PublicKey{f.auth.Public()})
	if err != nil {
		t.Fatal(err)
	}
	if f.uri, err = tpm.WithRevocation(uri, index); err != nil {
		t.Fatal(err)
	}
	if f.binding, err = tpm.CreationBinding(f.uri); err != nil {
		t.Fatal(err)
	}
	return f
}

// approve writes an approval of the TPM's current PCR 7 at epoch.
func (f *revocableFixture) approve(t *testing.T, name string, epoch uint64) *tpmpolicy.Approval {
	t.Helper()
	pcrs, vals, err := f.b.ReadPCRValues(ctx, f.uri)
	if err != nil {
		t.Fatal(err)
	}
	a, err := tpmpolicy.SignApproval(f.auth, f.binding, pcrs, vals, tpmpolicy.ApprovalMeta{Epoch: epoch, Note: name, CreatedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	writeApprovalFile(t, filepath.Join(f.approvals, name+".json"), a)
	return a
}

func (f *revocableFixture) generate(t *testing.T) *tpm.Signer {
	t.Helper()
	s, err := f.b.Generate(ctx, f.uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s.(*tpm.Signer)
}

func epochOf(t *testing.T, s *tpm.Signer) uint64 {
	t.Helper()
	e, err := s.RevocationEpoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestRevocationEpochOnSwtpm: an approval at the current epoch signs;
// policy revoke (the counter advanced past it) makes the TPM itself refuse
// it — with every software check skipped, with the true epoch
// (TPM_RC_POLICY at PolicyNV), with a lied higher epoch and without
// PolicyNV at all (TPM_RC_VALUE at PolicyAuthorize: the session is not
// the signed policy) — and the daemon's error names the revoked file and
// the exact re-approve command; an approval at the new epoch signs again
// without a restart.
func TestRevocationEpochOnSwtpm(t *testing.T) {
	f := newRevocableFixture(t, tpmpolicy.DefaultRevocationIndex)
	s := f.generate(t)
	e0 := epochOf(t, s)
	if e0 == 0 {
		t.Fatal("a fresh counter reads 0: PolicyNV would refuse an unwritten index")
	}
	old := f.approve(t, "old", e0)
	mustSign(t, s)

	from, to, err := s.Revoke(ctx, e0+1, nil)
	if err != nil || from != e0 || to != e0+1 {
		t.Fatalf("Revoke(%d) = %d, %d, %v", e0+1, from, to, err)
	}
	err = mustRefuse(t, s)
	for _, want := range []string{"old.json", "was revoked", fmt.Sprintf("epoch %d", e0), fmt.Sprintf("--epoch %d", e0+1), "policy approve --authority AUTHORITY_URI --key "} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error for a revoked approval %q lacks %q", err, want)
		}
	}
	digest := sha256.Sum256([]byte("csr"))
	for _, tc := range []struct {
		name  string
		epoch uint64
		skip  bool
		rc    tpm2.TPMRC
	}{
		{"true epoch", e0, false, tpm2.TPMRCPolicy},
		{"epoch lied upwards", e0 + 1, false, tpm2.TPMRCValue},
		{"PolicyNV skipped", e0, true, tpm2.TPMRCValue},
	} {
		if err := tpm.TPMSignWithEpochClaim(s, old, tc.epoch, tc.skip, digest[:]); !errors.Is(err, tc.rc) {
			t.Errorf("%s: TPM signing with the revoked approval, software checks skipped = %v, want %v", tc.name, err, tc.rc)
		}
	}
	f.approve(t, "new", e0+1)
	mustSign(t, s)
	if err := tpm.TPMSignWithApproval(s, old, digest[:]); !errors.Is(err, tpm2.TPMRCPolicy) {
		t.Errorf("the old approval after re-approval = %v, want TPM_RC_POLICY", err)
	}
	// Idempotent: a revoke already done (an interrupted one run again) does nothing.
	if from, to, err := s.Revoke(ctx, e0+1, nil); err != nil || from != e0+1 || to != e0+1 {
		t.Errorf("repeated Revoke = %d, %d, %v; want no step", from, to, err)
	}
	if _, _, err := s.Revoke(ctx, e0+2+tpmpolicy.MaxRevokeStep, nil); err == nil {
		t.Error("a revoke of more than MaxRevokeStep steps was accepted")
	}
}

// TestRevocationSurvivesRollback: the node runs firmware A (approved at
// e0), is upgraded to B, the fix is approved at e1 and A revoked. Booting
// A again (swtpm restarted: PCRs back to A's values, NV kept) finds A's
// approval still in the directory and refused; deleting and re-creating
// the counter (root with owner authorization) does not bring its value
// back (the TPM starts a new counter at the highest value one had).
func TestRevocationSurvivesRollback(t *testing.T) {
	f := newRevocableFixture(t, tpmpolicy.DefaultRevocationIndex)
	s := f.generate(t)
	e0 := epochOf(t, s)
	f.approve(t, "firmware-a", e0)
	mustSign(t, s)
	f.sw.ExtendPCR(t, 7, []byte("firmware B"))
	if _, _, err := s.Revoke(ctx, e0+1, nil); err != nil {
		t.Fatal(err)
	}
	f.approve(t, "firmware-b", e0+1)
	mustSign(t, s)

	f.sw.Restart(t) // reboot into firmware A: PCR 7 back to A's value
	eventually(t, "the signer reconnects and refuses A", func() error {
		err := sign(s)
		if err == nil || !strings.Contains(err.Error(), "firmware-a.json of this PCR state was revoked") {
			return fmt.Errorf("sign after rollback = %w, want the revoked firmware-a.json", err)
		}
		return nil
	})
	s.Close()
	recreateCounter(t, f.sw, tpmpolicy.DefaultRevocationIndex)
	s2, err := f.b.Open(ctx, f.uri)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if e := epochOf(t, s2.(*tpm.Signer)); e <= e0 {
		t.Fatalf("re-created counter reads %d, want more than the revoked epoch %d", e, e0)
	}
	mustRefuse(t, s2)
}

// recreateCounter deletes the counter and defines it again as the
// ceremony does: what root with owner authorization can try.
func recreateCounter(t *testing.T, sw *tpmsim.Swtpm, idx tpm2.TPMHandle) {
	t.Helper()
	c, err := sw.Dial(ctx, sw.Device())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	owner := tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)}
	pub, err := tpm2.NVReadPublic{NVIndex: idx}.Execute(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (tpm2.NVUndefineSpace{AuthHandle: owner, NVIndex: tpm2.NamedHandle{Handle: idx, Name: pub.NVName}}).Execute(c); err != nil {
		t.Fatal(err)
	}
	if _, err := (tpm2.NVDefineSpace{AuthHandle: owner, PublicInfo: tpm2.New2B(tpmpolicy.RevocationCounterPublic(idx, false))}).Execute(c); err != nil {
		t.Fatal(err)
	}
	unwritten := tpmpolicy.RevocationCounterPublic(idx, false)
	name, err := tpm2.NVName(&unwritten)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (tpm2.NVIncrement{AuthHandle: owner, NVIndex: tpm2.NamedHandle{Handle: idx, Name: *name}}).Execute(c); err != nil {
		t.Fatal(err)
	}
}

// TestRevocationIndexTaken: an NV index holding something else is refused
// with the flag to choose another; creating a second key over the same
// counter adopts it as it is (never resetting it), which is also how an
// interrupted creation resumes.
func TestRevocationIndexTaken(t *testing.T) {
	const idx tpm2.TPMHandle = 0x01000100
	f := newRevocableFixture(t, idx)
	c, err := f.sw.Dial(ctx, f.sw.Device())
	if err != nil {
		t.Fatal(err)
	}
	other := tpm2.TPMSNVPublic{NVIndex: idx, NameAlg: tpm2.TPMAlgSHA256, Attributes: tpm2.TPMANV{OwnerWrite: true, OwnerRead: true, NoDA: true, NT: tpm2.TPMNTOrdinary}, DataSize: 8}
	_, err = tpm2.NVDefineSpace{AuthHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)}, PublicInfo: tpm2.New2B(other)}.Execute(c)
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.b.Generate(ctx, f.uri, signer.ECDSAP256)
	if !errors.Is(err, signer.ErrKeyExists) || !strings.Contains(err.Error(), "--revocation-index") {
		t.Fatalf("Generate over a taken NV index = %v, want ErrKeyExists naming --revocation-index", err)
	}
	g := newRevocableFixture(t, tpmpolicy.DefaultRevocationIndex)
	s := g.generate(t)
	if _, _, err := s.Revoke(ctx, epochOf(t, s)+3, nil); err != nil {
		t.Fatal(err)
	}
	e := epochOf(t, s)
	s.Close()
	g.uri = strings.Replace(g.uri, "ca.tpmkey", "second.tpmkey", 1)
	s2 := g.generate(t)
	if got := epochOf(t, s2); got != e {
		t.Fatalf("a key adopting the existing counter reads epoch %d, want %d (never reset)", got, e)
	}
}
