package attestation_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"path/filepath"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/attestation"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// TestVerifySignedPolicyKey: a key under a policy authority verifies
// only against that authority's PolicyAuthorize digest, not against the
// PCR-bound shape nor another authority's.
func TestVerifySignedPolicyKey(t *testing.T) {
	ek := tpmsim.ProvisionEK(t)
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{StateDir: ek.StateDir})
	b := &tpm.Backend{Dial: sw.Dial}
	auth, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	dir := t.TempDir()
	uri, err := tpm.WithAuthorities("tpm:path="+filepath.Join(dir, "k.tpmkey")+";"+sw.URIAttrs()+";approvals="+dir, []crypto.PublicKey{&auth.PublicKey})
	if err != nil {
		t.Fatal(err)
	}
	s, err := b.Generate(ctx, uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	pub := s.Public()
	s.Close()
	ev, err := b.Attest(ctx, uri, qd("csr"))
	if err != nil {
		t.Fatal(err)
	}
	roots, err := attestation.ParseEKRoots(append(append([]byte{}, ek.RootPEM...), ek.IssuerPEM...))
	if err != nil {
		t.Fatal(err)
	}
	pcr7, err := tpmpolicy.BindingForPCRs([]int{7})
	if err != nil {
		t.Fatal(err)
	}
	digest := func(k *ecdsa.PrivateKey) []byte {
		d, err := tpmpolicy.SignedPolicyDigestFor([]crypto.PublicKey{&k.PublicKey}, pcr7)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	v1 := func(k *ecdsa.PrivateKey) []byte {
		d, err := tpmpolicy.SignedPolicyDigest([]crypto.PublicKey{&k.PublicKey})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	cases := []struct {
		name     string
		policies [][]byte
		want     attestation.Check
	}{
		{"its authority", [][]byte{digest(auth)}, ""},
		{"expected PCR-bound", nil, attestation.CheckKeyPolicy},
		{"another authority", [][]byte{digest(other)}, attestation.CheckKeyPolicy},
		{"its authority, v1 policy (selection not bound)", [][]byte{v1(auth)}, attestation.CheckKeyPolicy},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := attestation.Verify(ev, attestation.Options{EKRoots: roots, QualifyingData: qd("csr"), PublicKey: pub, AuthPolicies: tc.policies})
			if got := attestation.FailedCheck(err); got != tc.want || (tc.want == "") != (err == nil) {
				t.Fatalf("got %q (%v), want %q", got, err, tc.want)
			}
		})
	}
}
