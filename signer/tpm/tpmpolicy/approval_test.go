package tpmpolicy

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/signer"
)

func p256(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func authority(t *testing.T, k crypto.Signer) *Authority {
	t.Helper()
	a, err := NewAuthority(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func pcrValue(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func mustBinding(t testing.TB, pcrs ...int) Binding {
	t.Helper()
	b, err := BindingForPCRs(pcrs)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCheckApproval(t *testing.T) {
	auth, other := p256(t), p256(t)
	auths := []*Authority{authority(t, auth)}
	b := mustBinding(t, 7, 11)
	good, err := SignApproval(auth, b, []int{7, 11}, [][]byte{pcrValue(1), pcrValue(2)}, ApprovalMeta{Note: "n", CreatedAt: time.Unix(0, 0)})
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := SignApproval(other, b, []int{7, 11}, [][]byte{pcrValue(1), pcrValue(2)}, ApprovalMeta{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		change func(a *Approval)
		want   string
	}{
		{"valid", func(*Approval) {}, ""},
		{"wrong ref", func(a *Approval) { a.Ref = "" }, "ref"},
		{"v1 ref", func(a *Approval) { a.Ref = PolicyRef }, "ref"},
		{"ref of another selection", func(a *Approval) { a.Ref = mustBinding(t, 7).Ref() }, "ref"},
		{"another selection", func(a *Approval) { a.PCRs = []int{7} }, "not the key's"},
		{"resettable pcr", func(a *Approval) { a.PCRs = []int{7, 16} }, "debug PCR"},
		{"unsorted pcrs", func(a *Approval) { a.PCRs = []int{11, 7} }, "pcrs"},
		{"no pcrs", func(a *Approval) { a.PCRs = nil }, "pcrs"},
		{"pol not hex", func(a *Approval) { a.Pol = "zz" }, "pol"},
		{"other pol", func(a *Approval) { a.Pol = strings.Repeat("00", 32); a.PCRValues = nil }, "does not verify"},
		{"foreign key", func(a *Approval) { *a = *foreign }, "not an authority of this key"},
		{"no pkfp (an ECC authority has no systemd fingerprint)", func(a *Approval) { a.PKFP = "" }, "not an authority of this key"},
		{"foreign signature relabelled", func(a *Approval) { a.Sig = foreign.Sig }, "does not verify"},
		{"sig not base64", func(a *Approval) { a.Sig = "!" }, "base64"},
		{"sig not TPMT_SIGNATURE", func(a *Approval) { a.Sig = base64.StdEncoding.EncodeToString([]byte{1}) }, "TPMT_SIGNATURE"},
		{"pcrValues not the approved state", func(a *Approval) { a.PCRValues["7"] = hex.EncodeToString(pcrValue(9)) }, "pcrValues do not give pol"},
		{"pcrValues missing one", func(a *Approval) { delete(a.PCRValues, "11") }, "exactly the approved PCRs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := *good
			a.PCRValues = map[string]string{"7": good.PCRValues["7"], "11": good.PCRValues["11"]}
			tt.change(&a)
			c, err := checkApproval(a, auths, b)
			if tt.want == "" {
				if err != nil || c.Auth != 0 || !bytes.Equal(c.Pol, mustHex(t, good.Pol)) {
					t.Fatalf("checkApproval = %+v, %v", c, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("checkApproval = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestApprovalFileFormat(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []crypto.Signer{p256(t), rsaKey} {
		a, err := SignApproval(k, mustBinding(t, 7), []int{7}, [][]byte{pcrValue(3)}, ApprovalMeta{ApprovedBy: "ops", Note: "BIOS 1.2.3", CreatedAt: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		data, err := MarshalApprovals(a)
		if err != nil {
			t.Fatal(err)
		}
		// systemd's tpm2-pcr-signature.json shape plus our fields.
		var raw map[string][]map[string]any
		if err := json.Unmarshal(data, &raw); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"pcrs", "pkfp", "pol", "sig", "ref", "pcrValues", "approvedBy", "note", "createdAt"} {
			if _, ok := raw["sha256"][0][f]; !ok {
				t.Errorf("field %q missing: %s", f, data)
			}
		}
		got, err := ParseApprovals("a.json", data, []*Authority{authority(t, k)}, mustBinding(t, 7))
		if err != nil || len(got) != 1 || got[0].File != "a.json" {
			t.Fatalf("ParseApprovals = %+v, %v", got, err)
		}
		// The signature is over SHA-256(pol || ref).
		want := sha256.Sum256(append(mustHex(t, a.Pol), "steward-trustd/os-ca/v2:000080"...))
		if !bytes.Equal(ApprovalDigest(mustHex(t, a.Pol), a.Ref), want[:]) {
			t.Fatal("approval digest is not SHA-256(pol || ref)")
		}
	}
	for name, data := range map[string][]byte{
		"not json": []byte("{"),
		"empty":    []byte(`{"sha256":[]}`),
		"oversize": bytes.Repeat([]byte(" "), MaxApprovalFileSize+1),
	} {
		if _, err := ParseApprovals(name, data, nil, mustBinding(t, 7)); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func TestPCRPolicyDigest(t *testing.T) {
	// PolicyPCR (TPM 2.0 Part 3 §23.7): H(0^32 || TPM_CC_PolicyPCR || TPML_PCR_SELECTION || H(values)).
	sel := tpm2.Marshal(PCRSelection([]int{7}))
	vd := sha256.Sum256(pcrValue(0))
	h := sha256.New()
	h.Write(make([]byte, 32))
	h.Write(binary.BigEndian.AppendUint32(nil, uint32(tpm2.TPMCCPolicyPCR)))
	h.Write(sel)
	h.Write(vd[:])
	got, err := PCRPolicyDigest([]int{7}, [][]byte{pcrValue(0)})
	if err != nil || !bytes.Equal(got, h.Sum(nil)) {
		t.Fatalf("PCRPolicyDigest = %x, %v; want %x", got, err, h.Sum(nil))
	}
	for _, bad := range [][][]byte{nil, {pcrValue(0), pcrValue(1)}, {{1, 2}}} {
		if _, err := PCRPolicyDigest([]int{7}, bad); err == nil {
			t.Errorf("PCRPolicyDigest(%x) accepted", bad)
		}
	}
}

func TestAuthorizedPolicyDigest(t *testing.T) {
	a, b := authority(t, p256(t)), authority(t, p256(t))
	// PolicyAuthorize (Part 3 §23.16): H(H(0^32 || CC || name) || ref), then CC(Sign).
	h := sha256.New()
	h.Write(make([]byte, 32))
	h.Write(binary.BigEndian.AppendUint32(nil, uint32(tpm2.TPMCCPolicyAuthorize)))
	h.Write(a.name.Buffer)
	d1 := h.Sum(nil)
	h.Reset()
	h.Write(d1)
	h.Write([]byte(PolicyRef))
	d2 := h.Sum(nil)
	h.Reset()
	h.Write(d2)
	h.Write(binary.BigEndian.AppendUint32(nil, uint32(tpm2.TPMCCPolicyCommandCode)))
	h.Write(binary.BigEndian.AppendUint32(nil, uint32(tpm2.TPMCCSign)))
	one, _, err := authorizedPolicy([]*Authority{a})
	if err != nil || !bytes.Equal(one, h.Sum(nil)) {
		t.Fatalf("authorizedPolicy(a) = %x, %v; want %x", one, err, h.Sum(nil))
	}
	two, branches, err := authorizedPolicy([]*Authority{a, b})
	if err != nil || len(branches) != 2 || !bytes.Equal(branches[0], one) || bytes.Equal(two, one) {
		t.Fatalf("authorizedPolicy(a, b) = %x %x, %v", two, branches, err)
	}
	if _, _, err := authorizedPolicy(nil); err == nil {
		t.Error("no authorities accepted")
	}
	nine := make([]*Authority, MaxAuthorities+1)
	for i := range nine {
		nine[i] = a
	}
	if _, _, err := authorizedPolicy(nine); err == nil {
		t.Error("more than eight PolicyOR branches accepted")
	}
}

func TestAuthorityTemplates(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k := p256(t)
	a1, a2 := authority(t, k), authority(t, k)
	if !bytes.Equal(a1.Name(), a2.Name()) || len(a1.Name()) != 34 {
		t.Fatal("authority name is not stable")
	}
	ra := authority(t, rsaKey)
	rp := ra.public.ObjectAttributes
	if !rp.Decrypt || !rp.SignEncrypt || !rp.UserWithAuth || ra.public.Type != tpm2.TPMAlgRSA {
		t.Errorf("RSA authority is not Talos's template: %+v", rp)
	}
	if _, err := NewAuthority(p384.Public()); !errors.Is(err, signer.ErrUnsupportedAlgorithm) {
		t.Errorf("P-384 authority: %v", err)
	}
}

// TestKeyBlobAuthorizedRoundTrip: a blob under one or two authorities
// records its binding's policyRef in each PolicyAuthorize statement and
// gives it back, with the PCR selection a v2 ref binds.
func TestKeyBlobAuthorizedRoundTrip(t *testing.T) {
	for _, b := range []Binding{LegacyBinding(), mustBinding(t, 7, 11), SystemdBinding()} {
		for _, n := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/%d", b.Mode(), n), func(t *testing.T) { checkBlobRoundTrip(t, b, n) })
		}
	}
}

func checkBlobRoundTrip(t *testing.T, b Binding, n int) {
	auths := make([]*Authority, n)
	for i := range auths {
		auths[i] = authority(t, p256(t))
	}
	blob, policy, data := authorizedBlob(t, auths, b)
	got, err := ParseKeyBlob(data)
	if err != nil {
		t.Fatal(err)
	}
	if !SameAuthorities(got.Authorities, auths) || got.Binding.String() != b.String() || !slices.Equal(got.PCRs, b.PCRs()) {
		t.Fatalf("round trip changed authorities or Binding: %s, PCRs %v", got.Binding, got.PCRs)
	}
	replayed, err := got.AuthPolicy()
	if err != nil || !bytes.Equal(replayed, policy) {
		t.Fatalf("replayed policy %x, want %x (%v)", replayed, policy, err)
	}
	stmts, err := blob.policyStatements()
	if err != nil {
		t.Fatal(err)
	}
	// The draft: the first statement is PolicyAuthorize with TPM2B_PUBLIC
	// keySign, TPM2B_DIGEST policyRef and an empty TPMT_SIGNATURE.
	first := stmts[0]
	if first.CommandCode != int(tpm2.TPMCCPolicyAuthorize) || !bytes.HasSuffix(first.CommandPolicy, append(tpm2.Marshal(tpm2.TPM2BDigest{Buffer: []byte(b.Ref())}), 0x00, 0x10)) {
		t.Fatalf("first statement %x", first.CommandPolicy)
	}
}

// authorizedBlob is a key blob (a dummy private part) under auths with
// binding b, its authPolicy and its PEM file contents.
func authorizedBlob(t *testing.T, auths []*Authority, b Binding) (*KeyBlob, []byte, []byte) {
	t.Helper()
	policy, _, err := AuthorizedPolicy(auths, b.Ref())
	if err != nil {
		t.Fatal(err)
	}
	blob := &KeyBlob{Public: tpm2.New2B(KeyTemplate(tpm2.TPMECCNistP256, policy, false)), Private: tpm2.TPM2BPrivate{Buffer: []byte{1}}, Authorities: auths, Binding: b}
	data, err := blob.MarshalPEM("test")
	if err != nil {
		t.Fatal(err)
	}
	return blob, policy, data
}

// TestBindingRefs: the v2 policyRef names the selection as a 24-bit
// mask, fits a SHA-256-only TPM's TPM2B_NONCE (32 bytes), and decodes
// back; refs this backend never makes, and resettable PCRs, are refused.
func TestBindingRefs(t *testing.T) {
	for _, tc := range []struct {
		pcrs []int
		ref  string
	}{
		{[]int{7}, "steward-trustd/os-ca/v2:000080"},
		{[]int{7, 11}, "steward-trustd/os-ca/v2:000880"},
		{[]int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 17, 18, 19}, "steward-trustd/os-ca/v2:0effff"},
	} {
		b := mustBinding(t, tc.pcrs...)
		if b.Ref() != tc.ref || len(b.Ref()) > 32 || b.Mode() != "v2" {
			t.Errorf("BindingForPCRs(%v) = %q, want %q (at most 32 bytes)", tc.pcrs, b.Ref(), tc.ref)
		}
		back, err := bindingOfRef(b.Ref())
		if err != nil || !slices.Equal(back.PCRs(), tc.pcrs) {
			t.Errorf("bindingOfRef(%q) = %v, %v", b.Ref(), back, err)
		}
	}
	for _, ref := range []string{"steward-trustd/os-ca/v2:010080", "steward-trustd/os-ca/v2:000000", "steward-trustd/os-ca/v2:00008", "steward-trustd/os-ca/v2:00008G", "steward-trustd/os-ca/v2:0000A0", "other"} {
		if b, err := bindingOfRef(ref); err == nil {
			t.Errorf("bindingOfRef(%q) = %v, want an error", ref, b)
		}
	}
	if b, err := bindingOfRef(PolicyRef); err != nil || b.PCRs() != nil || b.Weakness() == "" {
		t.Errorf("v1 ref: %v, %v; want a binding of no selection, with a warning", b, err)
	}
	if b, err := bindingOfRef(""); err != nil || !b.Systemd() || !slices.Equal(b.PCRs(), []int{SystemdPCR}) {
		t.Errorf("empty ref: %v, %v; want the systemd binding", b, err)
	}
	if err := (Binding{}).check([]int{7}); err == nil {
		t.Error("the zero Binding accepted a selection")
	}
}

// FuzzParseApprovals: whatever the bytes, parsing an approval file never
// panics, and what it accepts was signed by the authority.
func FuzzParseApprovals(f *testing.F) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	b := mustBinding(f, 7)
	a, err := SignApproval(k, b, []int{7}, [][]byte{pcrValue(1)}, ApprovalMeta{})
	if err != nil {
		f.Fatal(err)
	}
	good, err := MarshalApprovals(a)
	if err != nil {
		f.Fatal(err)
	}
	auths := []*Authority{}
	if x, err := NewAuthority(k.Public()); err == nil {
		auths = append(auths, x)
	}
	for _, s := range [][]byte{good, []byte(`{"sha256":[{}]}`), []byte("{")} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := ParseApprovals("f.json", data, auths, b)
		if err != nil {
			return
		}
		for _, c := range got {
			if c.Ref != b.Ref() || !slices.Equal(c.PCRs, []int{7}) || verifyTPMT(auths[c.Auth], ApprovalDigest(c.Pol, b.Ref()), c.Sig) != nil {
				t.Fatalf("accepted an approval whose signature does not verify: %+v", c)
			}
		}
	})
}

// TestSignApprovalRefusesWhatTheSignerRefuses: SignApproval must not sign
// a selection checkApproval would refuse (duplicate or out-of-range PCRs),
// nor panic on a negative index.
func TestSignApprovalRefusesWhatTheSignerRefuses(t *testing.T) {
	auth := p256(t)
	for _, tc := range []struct {
		name string
		pcrs []int
	}{
		{"negative", []int{-1, 7}},
		{"duplicate", []int{7, 7}},
		{"above 23", []int{7, 24}},
		{"unsorted", []int{11, 7}},
		{"empty", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := make([][]byte, len(tc.pcrs))
			for i := range vals {
				vals[i] = pcrValue(byte(i))
			}
			if _, err := SignApproval(auth, LegacyBinding(), tc.pcrs, vals, ApprovalMeta{}); err == nil || !strings.Contains(err.Error(), "PCR") {
				t.Fatalf("SignApproval(%v) = %v, want an error about the PCRs", tc.pcrs, err)
			}
		})
	}
}
