package tpm_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// logBuf collects log lines for assertions.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

func newP256(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// authorizedFixture is a key under policy authorities in the in-process
// simulator.
type authorizedFixture struct {
	sim       *tpmsim.Simulator
	b         *tpm.Backend
	uri       string
	approvals string
	log       *logBuf
}

func newAuthorizedFixture(t testing.TB, auths ...crypto.Signer) *authorizedFixture {
	t.Helper()
	f := &authorizedFixture{sim: tpmsim.NewSimulator(t), log: &logBuf{}}
	f.b = &tpm.Backend{Dial: f.sim.Dial, ApprovalsReload: time.Nanosecond, Logger: slog.New(slog.NewTextHandler(f.log, nil))}
	dir := t.TempDir()
	f.approvals = filepath.Join(dir, "approvals")
	if err := os.Mkdir(f.approvals, 0o755); err != nil {
		t.Fatal(err)
	}
	pubs := make([]crypto.PublicKey, len(auths))
	for i, a := range auths {
		pubs[i] = a.Public()
	}
	uri, err := tpm.WithAuthorities("tpm:path="+filepath.Join(dir, "ca.tpmkey")+";socket=/unused;approvals="+f.approvals, pubs)
	if err != nil {
		t.Fatal(err)
	}
	f.uri = uri
	return f
}

// approve writes an approval of the TPM's current PCR 7 by auth.
func (f *authorizedFixture) approve(t testing.TB, auth crypto.Signer, name string) {
	t.Helper()
	pcrs, vals, err := f.b.ReadPCRValues(ctx, f.uri)
	if err != nil {
		t.Fatal(err)
	}
	b, err := tpmpolicy.BindingForPCRs(pcrs)
	if err != nil {
		t.Fatal(err)
	}
	a, err := tpmpolicy.SignApproval(auth, b, pcrs, vals, tpmpolicy.ApprovalMeta{Note: name, CreatedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	writeApprovalFile(t, filepath.Join(f.approvals, name+".json"), a)
}

// generate creates the fixture's key, closed when the test ends.
func (f *authorizedFixture) generate(t *testing.T) signer.Signer {
	t.Helper()
	s, err := f.b.Generate(ctx, f.uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mustSign(t *testing.T, s signer.Signer) {
	t.Helper()
	d := sha256.Sum256([]byte("csr"))
	sig, err := s.Sign(rand.Reader, d[:], crypto.SHA256)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	if !ecdsa.VerifyASN1(s.Public().(*ecdsa.PublicKey), d[:], sig) {
		t.Fatal("signature does not verify")
	}
}

func mustRefuse(t *testing.T, s signer.Signer) error {
	t.Helper()
	d := sha256.Sum256([]byte("csr"))
	_, err := s.Sign(rand.Reader, d[:], crypto.SHA256)
	if !errors.Is(err, signer.ErrPolicyNotSatisfied) {
		t.Fatalf("Sign = %v, want ErrPolicyNotSatisfied", err)
	}
	return err
}

func TestAuthorizedPolicyLifecycle(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		auth crypto.Signer
	}{{"p256", newP256(t)}, {"rsa2048", rsaKey}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newAuthorizedFixture(t, tc.auth)
			f.approve(t, tc.auth, "boot-1")
			s, err := f.b.Generate(ctx, f.uri, signer.ECDSAP256)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			mustSign(t, s)
			mustSign(t, s) // cached ticket, remembered approval
			if d := s.Describe(); !strings.Contains(d.Policy, "authorized by") {
				t.Errorf("Describe().Policy = %q", d.Policy)
			}

			f.sim.ExtendPCR(t, 7, []byte("dbx update"))
			err = mustRefuse(t, s)
			if !strings.Contains(err.Error(), "--pcr 7=") || !strings.Contains(err.Error(), "PolicyPCR digest") {
				t.Errorf("error does not tell the approver what to sign: %v", err)
			}

			f.approve(t, newP256(t), "foreign") // another key: ignored
			mustRefuse(t, s)
			if f.log.count("approval file ignored") != 1 {
				t.Errorf("want one log line for the foreign approval:\n%s", f.log.b.String())
			}

			f.approve(t, tc.auth, "boot-2")
			mustSign(t, s)

			reopened, err := f.b.Open(ctx, f.uri)
			if err != nil {
				t.Fatal(err)
			}
			defer reopened.Close()
			mustSign(t, reopened)
			if !reopened.Public().(*ecdsa.PublicKey).Equal(s.Public()) {
				t.Fatal("reopened key differs")
			}

			if err := os.Remove(filepath.Join(f.approvals, "boot-2.json")); err != nil {
				t.Fatal(err)
			}
			mustRefuse(t, s) // retired by removing the file
		})
	}
}

func TestAuthorizedPolicyOR(t *testing.T) {
	primary, breakGlass := newP256(t), newP256(t)
	f := newAuthorizedFixture(t, primary, breakGlass)
	f.approve(t, breakGlass, "break-glass")
	s, err := f.b.Generate(ctx, f.uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mustSign(t, s)
	f.sim.ExtendPCR(t, 7, []byte("firmware"))
	mustRefuse(t, s)
	f.approve(t, primary, "primary")
	mustSign(t, s)
}

func TestApprovalFilesIgnoredOneLineEach(t *testing.T) {
	auth := newP256(t)
	f := newAuthorizedFixture(t, auth)
	f.approve(t, auth, "good")
	good, err := os.ReadFile(filepath.Join(f.approvals, "good.json"))
	if err != nil {
		t.Fatal(err)
	}
	tampered := bytes.Replace(good, []byte(`"pol": "`), []byte(`"pol": "00`), 1)
	tampered = bytes.Replace(tampered, []byte(`"pcrValues"`), []byte(`"x"`), 1)
	for name, data := range map[string][]byte{
		"malformed.json": []byte("{not json"),
		"tampered.json":  tampered,
		"empty.json":     []byte(`{"sha256":[]}`),
		"notes.txt":      []byte("ignored: not .json"),
	} {
		if err := os.WriteFile(filepath.Join(f.approvals, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, err := f.b.Generate(ctx, f.uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for range 3 {
		mustSign(t, s)
	}
	if n := f.log.count("approval file ignored"); n != 3 {
		t.Errorf("%d 'ignored' lines, want 3 (one per bad file, once):\n%s", n, f.log.b.String())
	}
}

func TestAuthorizedNeedsApprovalsDir(t *testing.T) {
	auth := newP256(t)
	f := newAuthorizedFixture(t, auth)
	f.approve(t, auth, "a")
	s, err := f.b.Generate(ctx, f.uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	path := strings.TrimPrefix(strings.Split(f.uri, ";")[0], "tpm:path=")
	if _, err := f.b.Open(ctx, "tpm:path="+path+";socket=/unused"); !errors.Is(err, signer.ErrInvalidURI) || !strings.Contains(err.Error(), "approvals=") {
		t.Fatalf("Open without approvals= = %v", err)
	}
	other, err := tpm.WithAuthorities("tpm:path="+path+";socket=/unused;approvals="+f.approvals, []crypto.PublicKey{newP256(t).Public()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.b.Open(ctx, other); !errors.Is(err, signer.ErrInvalidURI) {
		t.Fatalf("Open with another authority = %v", err)
	}
}

func TestQuoteVerification(t *testing.T) {
	sim := tpmsim.NewSimulator(t)
	b := &tpm.Backend{Dial: sim.Dial}
	uri := "tpm:path=/unused/ca.tpmkey;socket=/unused;pcrs=7,11"
	ak, err := b.AttestationKey(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	ak2, err := b.AttestationKey(ctx, uri)
	if err != nil || !ak.Equal(ak2) {
		t.Fatalf("attestation key is not reproducible: %v", err)
	}
	nonce := []byte("approver nonce 0123456789abcdef")
	q, err := b.Quote(ctx, uri, nonce)
	if err != nil {
		t.Fatal(err)
	}
	pcrs, vals, err := tpmpolicy.VerifyQuote(q, ak, nonce)
	if err != nil {
		t.Fatal(err)
	}
	_, want, err := b.ReadPCRValues(ctx, uri)
	if err != nil || len(pcrs) != 2 || !bytes.Equal(vals[0], want[0]) || !bytes.Equal(vals[1], want[1]) {
		t.Fatalf("quoted state %v %x, want %x (%v)", pcrs, vals, want, err)
	}
	tampered := *q
	tampered.PCRValues = map[string]string{"7": strings.Repeat("ff", 32), "11": q.PCRValues["11"]}
	for _, tc := range []struct {
		name  string
		q     *tpmpolicy.Quote
		ak    *ecdsa.PublicKey
		nonce []byte
		want  string
	}{
		{"wrong nonce", q, ak, []byte("another nonce"), "nonce differs"},
		{"another AK", q, &newP256(t).PublicKey, nonce, "not signed by the pinned attestation key"},
		{"values not quoted", &tampered, ak, nonce, "do not match the quoted digest"},
		{"resettable PCR named", &tpmpolicy.Quote{PCRs: []int{7, 16}, PCRValues: q.PCRValues, Nonce: q.Nonce, Attest: q.Attest, Signature: q.Signature}, ak, nonce, "debug PCR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := tpmpolicy.VerifyQuote(tc.q, tc.ak, tc.nonce); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("tpmpolicy.VerifyQuote = %v, want %q", err, tc.want)
			}
		})
	}
	tpmsim.CheckNoLeaks(t, sim.TPM())
}

func TestPolicyReport(t *testing.T) {
	auth := newP256(t)
	f := newAuthorizedFixture(t, auth)
	f.approve(t, auth, "now")
	s := f.generate(t)
	ts := s.(*tpm.Signer)
	r, err := ts.PolicyReport(ctx)
	if err != nil || r.Matching != filepath.Join(f.approvals, "now.json") || r.Approvals != 1 || len(r.Authorities) != 1 {
		t.Fatalf("PolicyReport = %+v, %v", r, err)
	}
	if r.Binding != "v2" || r.PolicyRef != "steward-trustd/os-ca/v2:000080" || !slices.Equal(r.BoundPCRs, []int{7}) || r.Warning != "" || r.Authorities[0].SystemdFingerprint != "" {
		t.Fatalf("PolicyReport binding = %q %q %v %q, systemd pkfp %q; want v2 over PCR 7, no warning, none for ECC", r.Binding, r.PolicyRef, r.BoundPCRs, r.Warning, r.Authorities[0].SystemdFingerprint)
	}
	f.sim.ExtendPCR(t, 7, []byte("update"))
	r, err = ts.PolicyReport(ctx)
	if err != nil || r.Matching != "" || !strings.Contains(r.MatchError, r.PolicyPCRDigest) || !strings.Contains(r.MatchError, "policy approve --authority AUTHORITY_URI --key /") || !strings.Contains(r.MatchError, "ca.tpmkey --pcr 7=") {
		t.Fatalf("PolicyReport after extend = %+v, %v", r, err)
	}
	if err := ts.CheckPolicy(ctx); !errors.Is(err, signer.ErrPolicyNotSatisfied) {
		t.Fatalf("CheckPolicy = %v", err)
	}
}

// TestForgedApprovalRefusedByTPM: an approval signed by another key and
// relabelled with the authority's fingerprint never unlocks the key: the
// TPM's TPM2_VerifySignature refuses it (TPM 2.0 Part 3 §20.1), with the
// response code kept in the error chain.
func TestForgedApprovalRefusedByTPM(t *testing.T) {
	auth, forger := newP256(t), newP256(t)
	f := newAuthorizedFixture(t, auth)
	f.approve(t, auth, "real")
	s, err := f.b.Generate(ctx, f.uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pcrs, vals, err := f.b.ReadPCRValues(ctx, f.uri)
	if err != nil {
		t.Fatal(err)
	}
	b, err := tpmpolicy.BindingForPCRs(pcrs)
	if err != nil {
		t.Fatal(err)
	}
	forged, err := tpmpolicy.SignApproval(forger, b, pcrs, vals, tpmpolicy.ApprovalMeta{})
	if err != nil {
		t.Fatal(err)
	}
	err = tpm.TPMVerifyApproval(s.(*tpm.Signer), forged)
	if !errors.Is(err, tpm2.TPMRCSignature) || !errors.Is(err, signer.ErrPolicyNotSatisfied) {
		t.Fatalf("TPM verification of a forged approval = %v, want TPM_RC_SIGNATURE and ErrPolicyNotSatisfied", err)
	}
	mustSign(t, s)
}

// TestAuthorizedImportAndHandle: Import (verified by signing, so the
// approval must exist first) and a persistent handle, whose authorities
// come from the URI (a handle carries no blob).
func TestAuthorizedImportAndHandle(t *testing.T) {
	auth := newP256(t)
	f := newAuthorizedFixture(t, auth)
	f.approve(t, auth, "now")
	s, err := f.b.Import(ctx, f.uri, newP256(t))
	if err != nil {
		t.Fatal(err)
	}
	mustSign(t, s)
	s.Close()

	handleURI, err := tpm.WithAuthorities("tpm:handle=0x81000110;socket=/unused;approvals="+f.approvals, []crypto.PublicKey{auth.Public()})
	if err != nil {
		t.Fatal(err)
	}
	h, err := f.b.Generate(ctx, handleURI, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	mustSign(t, h)
	h.Close()
	reopened, err := f.b.Open(ctx, handleURI)
	if err != nil {
		t.Fatal(err)
	}
	defer reopened.Close()
	mustSign(t, reopened)
	f.sim.ExtendPCR(t, 7, []byte("update"))
	mustRefuse(t, reopened)
}

// TestApprovalReplacedByOtherAuthority replaces an approval file by an
// approval of the same PCR state from the other authority: the TPM
// ticket cached for the first authority must not be presented for the
// second (PolicyAuthorize would refuse it and the signature fail).
func TestApprovalReplacedByOtherAuthority(t *testing.T) {
	primary, breakGlass := newP256(t), newP256(t)
	f := newAuthorizedFixture(t, primary, breakGlass)
	f.approve(t, primary, "boot")
	s, err := f.b.Generate(ctx, f.uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mustSign(t, s)
	f.approve(t, breakGlass, "boot")
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(filepath.Join(f.approvals, "boot.json"), later, later); err != nil {
		t.Fatal(err)
	}
	mustSign(t, s)
	mustSign(t, s)
}

// stallingTPM holds back the answer to the first TPM2_VerifySignature
// for hold, as a device whose read Close does not interrupt answers late:
// the operation that sent it has been abandoned by the timeout by then.
// It takes no lock shared with the test, so that the race detector sees
// what the signer alone synchronizes.
type stallingTPM struct {
	transport.TPMCloser
	hold    time.Duration
	stalled *atomic.Bool
}

func (s stallingTPM) Send(cmd []byte) ([]byte, error) {
	rsp, err := s.TPMCloser.Send(cmd)
	if len(cmd) >= 10 && tpm2.TPMCC(binary.BigEndian.Uint32(cmd[6:10])) == tpm2.TPMCCVerifySignature {
		if s.stalled.CompareAndSwap(false, true) {
			time.Sleep(s.hold)
		}
	}
	return rsp, err
}

// Close leaves the simulator connection usable, as closing a device file
// with a read in progress releases it only when the read returns.
func (stallingTPM) Close() error { return nil }

// TestAbandonedAuthorizedOperation: an operation abandoned by the timeout
// that gets its TPM answer later must not touch the ticket cache
// unsynchronized with the next operation (a concurrent map write is a
// fatal error of the daemon). Fails under -race before the fix.
func TestAbandonedAuthorizedOperation(t *testing.T) {
	auth := newP256(t)
	f := newAuthorizedFixture(t, auth)
	t.Cleanup(func() { // the abandoned connection's key is not flushed
		hs, _ := tpm.LoadedHandles(f.sim.TPM())
		for _, h := range hs {
			_, _ = tpm2.FlushContext{FlushHandle: h}.Execute(f.sim.TPM())
		}
	})
	f.approve(t, auth, "boot")
	// The bound must cover a whole key load and policy on a loaded
	// 2-core machine under -race (100ms did not); the stall outlasts it.
	const bound, hold = 750 * time.Millisecond, 1800 * time.Millisecond
	stalled := &atomic.Bool{}
	f.b.RetryInterval = time.Millisecond
	f.b.Dial = func(ctx context.Context, d tpm.Device) (transport.TPMCloser, error) {
		c, err := f.sim.Dial(ctx, d)
		return stallingTPM{TPMCloser: c, hold: hold, stalled: stalled}, err
	}
	s, err := f.b.Generate(ctx, f.uri+";timeout="+bound.String(), signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ps := s.(interface{ CheckPolicy(context.Context) error })
	if err := ps.CheckPolicy(ctx); !errors.Is(err, signer.ErrDeviceUnavailable) {
		t.Fatalf("CheckPolicy with a stalled TPM = %v, want ErrDeviceUnavailable", err)
	}
	time.Sleep(2 * time.Millisecond) // the retry interval
	if err := ps.CheckPolicy(ctx); err != nil {
		t.Fatalf("CheckPolicy on a new connection: %v", err)
	}
	time.Sleep(hold) // the abandoned operation gets its answer and ends
	mustSign(t, s)
}

// resetPCR resets PCR idx in the simulator from locality 0 (TPM2_PCR_Reset,
// TPM 2.0 Part 3 §22.3), as any process with TPM access can for PCR 16.
func resetPCR(t *testing.T, sim *tpmsim.Simulator, idx int) {
	t.Helper()
	_, err := tpm2.PCRReset{PCRHandle: tpm2.AuthHandle{Handle: tpm2.TPMHandle(idx), Auth: tpm2.PasswordAuth(nil)}}.Execute(sim.TPM())
	if err != nil {
		t.Fatalf("reset PCR %d: %v", idx, err)
	}
}

// TestSelectionBoundByTPM: a v2 key (pcrs=7) binds its selection in its
// policyRef. After the boot state changed (PCR 7 extended) and PCR 16 was
// reset to zeros, approvals of that state over pcrs=7,16 signed by the
// right authority — with the ref a v2 tool derives for 7,16, or the v1
// ref an old tool signs — are refused by the software check and, with
// every software check skipped, by the TPM itself (TPM_RC_POLICY_FAIL at
// TPM2_Sign: the session digest is not the key's policy). The control: the
// same path with an approval of the key's own selection and ref signs.
func TestSelectionBoundByTPM(t *testing.T) {
	auth := newP256(t)
	f := newAuthorizedFixture(t, auth)
	f.approve(t, auth, "boot")
	s := f.generate(t)
	mustSign(t, s)
	if err := os.Remove(filepath.Join(f.approvals, "boot.json")); err != nil {
		t.Fatal(err)
	}
	f.sim.ExtendPCR(t, 7, []byte("attacker's boot chain"))
	resetPCR(t, f.sim, 16)
	vals, err := tpm.ReadPCRs(f.sim.TPM(), []int{7, 16})
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256([]byte("csr"))
	for name, ref := range map[string]string{
		"v2 ref of 7,16":  "steward-trustd/os-ca/v2:010080", // what tpmpolicy.BindingForPCRs would make, were 16 allowed
		"v1 ref":          tpmpolicy.PolicyRef,
		"empty (systemd)": "",
	} {
		t.Run(name, func(t *testing.T) {
			a := writeApproval(t, filepath.Join(f.approvals, "wide.json"), auth, ref, []int{7, 16}, vals)
			mustRefuse(t, s)
			err := tpm.TPMSignWithApproval(s.(*tpm.Signer), a, digest[:])
			if !errors.Is(err, tpm2.TPMRCPolicyFail) {
				t.Fatalf("TPM signing with an approval over pcrs=7,16 (ref %q) = %v, want TPM_RC_POLICY_FAIL", ref, err)
			}
		})
	}
	own, err := tpm.UncheckedApproval(auth, mustBindingRef(t, 7), []int{7}, vals[:1])
	if err != nil {
		t.Fatal(err)
	}
	if err := tpm.TPMSignWithApproval(s.(*tpm.Signer), own, digest[:]); err != nil {
		t.Fatalf("control: TPM signing with an approval of the key's own selection = %v", err)
	}
}

func mustBindingRef(t *testing.T, pcrs ...int) string {
	t.Helper()
	b, err := tpmpolicy.BindingForPCRs(pcrs)
	if err != nil {
		t.Fatal(err)
	}
	return b.Ref()
}

// TestV1KeyKeepsWorkingAndIsWarned: a key made before the selection was
// bound (policyRef v1) still opens and signs with v1 approvals, and
// policy approve's binding for it signs the v1 ref. Its report warns and
// points at rotate — rightly: with every software check skipped, the TPM
// accepts an approval over pcrs=7,16 for it (the contrast to
// TestSelectionBoundByTPM), though our software ignores that approval.
func TestV1KeyKeepsWorkingAndIsWarned(t *testing.T) {
	auth := newP256(t)
	f := newAuthorizedFixture(t, auth)
	s, err := tpm.GenerateV1(ctx, f.b, f.uri)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	b, _, err := tpm.KeyBinding(f.uri)
	if err != nil || b.Mode() != "v1" || b.Ref() != tpmpolicy.PolicyRef {
		t.Fatalf("KeyBinding of a v1 key = %v, %v", b, err)
	}
	vals, err := tpm.ReadPCRs(f.sim.TPM(), []int{7})
	if err != nil {
		t.Fatal(err)
	}
	a, err := tpmpolicy.SignApproval(auth, b, []int{7}, vals, tpmpolicy.ApprovalMeta{})
	if err != nil {
		t.Fatal(err)
	}
	writeApprovalFile(t, filepath.Join(f.approvals, "v1.json"), a)
	s, err = f.b.Open(ctx, f.uri)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mustSign(t, s)
	r, err := s.(*tpm.Signer).PolicyReport(ctx)
	if err != nil || r.Binding != "v1" || !strings.Contains(r.Warning, "rotate") {
		t.Fatalf("PolicyReport of a v1 key = %+v, %v; want a warning pointing at rotate", r, err)
	}
	if n := f.log.count("weak key policy"); n != 1 {
		t.Fatalf("%d WARN lines about the v1 policy at open, want 1", n)
	}
	f.sim.ExtendPCR(t, 7, []byte("attacker's boot chain"))
	resetPCR(t, f.sim, 16)
	wide, err := tpm.ReadPCRs(f.sim.TPM(), []int{7, 16})
	if err != nil {
		t.Fatal(err)
	}
	w, err := tpm.UncheckedApproval(auth, tpmpolicy.PolicyRef, []int{7, 16}, wide)
	if err != nil {
		t.Fatal(err)
	}
	d := sha256.Sum256([]byte("csr"))
	if err := tpm.TPMSignWithApproval(s.(*tpm.Signer), w, d[:]); err != nil {
		t.Fatalf("the TPM refused a v1 key's approval over 7,16 (%v): then the v2 test shows nothing", err)
	}
}
