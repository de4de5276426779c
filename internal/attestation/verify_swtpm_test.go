package attestation_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/internal/attestation"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

var ctx = context.Background()

// node is a TPM with a vendor-style EK certificate chain and a CA key.
type node struct {
	sw    *tpmsim.Swtpm
	b     *tpm.Backend
	ek    *tpmsim.EKChain
	uri   string
	key   *ecdsa.PublicKey
	roots *attestation.EKRoots
}

func newNode(t *testing.T) *node {
	t.Helper()
	ek := tpmsim.ProvisionEK(t)
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{StateDir: ek.StateDir})
	b := &tpm.Backend{Dial: sw.Dial}
	uri := "tpm:path=" + filepath.Join(t.TempDir(), "ca.tpmkey") + ";" + sw.URIAttrs() + ";pcrs=7"
	s, err := b.Generate(ctx, uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	roots, err := attestation.ParseEKRoots(append(append([]byte{}, ek.RootPEM...), ek.IssuerPEM...))
	if err != nil {
		t.Fatal(err)
	}
	return &node{sw: sw, b: b, ek: ek, uri: uri, key: s.Public().(*ecdsa.PublicKey), roots: roots}
}

func qd(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }

func TestAttestVerifyActivate(t *testing.T) {
	n := newNode(t)
	ev, err := n.b.Attest(ctx, n.uri, qd("csr"))
	if err != nil {
		t.Fatal(err)
	}
	opts := attestation.Options{EKRoots: n.roots, QualifyingData: qd("csr"), PublicKey: n.key}
	res, err := attestation.Verify(ev, opts)
	if err != nil {
		t.Fatal(err)
	}
	if res.EK.Root != "CN=swtpm-localca-rootca" || !slices.Equal(res.PCRs, []int{7}) || res.OutsideInfo != "steward-trustd OS CA" {
		t.Fatalf("result %+v", res)
	}
	// The evidence survives a JSON round trip byte for byte.
	data, err := ev.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	ev2, err := attestation.ParseEvidence(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := attestation.Verify(ev2, opts); err != nil {
		t.Fatal(err)
	}

	payload := []byte("-----BEGIN CERTIFICATE-----\nintermediate\n-----END CERTIFICATE-----\n")
	sealed, err := attestation.Seal(nil, ev, payload)
	if err != nil {
		t.Fatal(err)
	}
	got, err := n.b.ActivateCredential(ctx, n.uri, sealed)
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("activate on the attested TPM: %q, %v", got, err)
	}

	t.Run("another TPM cannot activate", func(t *testing.T) {
		other := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
		ob := &tpm.Backend{Dial: other.Dial}
		_, err := ob.ActivateCredential(ctx, "tpm:path=/x;"+other.URIAttrs(), sealed)
		if !errors.Is(err, tpm.ErrOtherTPM) {
			t.Fatalf("got %v, want ErrOtherTPM", err)
		}
	})
	t.Run("tampered payload", func(t *testing.T) {
		bad := *sealed
		bad.Ciphertext = flip(sealed.Ciphertext, 3)
		_, err := n.b.ActivateCredential(ctx, n.uri, &bad)
		if attestation.FailedCheck(err) != attestation.CheckCredential {
			t.Fatalf("got %v", err)
		}
	})
}

func TestVerifyRefuses(t *testing.T) {
	n := newNode(t)
	ev, err := n.b.Attest(ctx, n.uri, qd("csr"))
	if err != nil {
		t.Fatal(err)
	}
	// A second key of the same TPM, for a swapped public area.
	uri2 := "tpm:path=" + filepath.Join(t.TempDir(), "b.tpmkey") + ";" + n.sw.URIAttrs()
	s2, err := n.b.Generate(ctx, uri2, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	s2.Close()
	ev2, err := n.b.Attest(ctx, uri2, qd("csr"))
	if err != nil {
		t.Fatal(err)
	}
	foreignRoot, err := attestation.ParseEKRoots(selfSigned(t))
	if err != nil {
		t.Fatal(err)
	}
	rootOnly, err := attestation.ParseEKRoots(n.ek.RootPEM)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	cases := []struct {
		name string
		edit func(e *attestation.Evidence, o *attestation.Options)
		want attestation.Check
	}{
		{"another EK root", func(_ *attestation.Evidence, o *attestation.Options) { o.EKRoots = foreignRoot }, attestation.CheckEKCertificate},
		{"missing EK intermediate", func(_ *attestation.Evidence, o *attestation.Options) { o.EKRoots = rootOnly }, attestation.CheckEKCertificate},
		{"EK certificate of another TPM", func(e *attestation.Evidence, _ *attestation.Options) {
			e.EKPublic = flip(e.EKPublic, len(e.EKPublic)-5)
		}, attestation.CheckEKPublic},
		{"AK not restricted", func(e *attestation.Evidence, _ *attestation.Options) { e.AKPublic = clearRestricted(t, e.AKPublic) }, attestation.CheckAKPublic},
		{"not TPM generated", func(e *attestation.Evidence, _ *attestation.Options) { e.Attest = flip(e.Attest, 0) }, attestation.CheckAttestFormat},
		{"tampered attestation", func(e *attestation.Evidence, _ *attestation.Options) { e.Attest = flip(e.Attest, len(e.Attest)-1) }, attestation.CheckAttestSig},
		{"tampered signature", func(e *attestation.Evidence, _ *attestation.Options) {
			e.Signature = flip(e.Signature, len(e.Signature)-1)
		}, attestation.CheckAttestSig},
		{"another request", func(_ *attestation.Evidence, o *attestation.Options) { o.QualifyingData = qd("other csr") }, attestation.CheckQualifyingData},
		{"swapped key public area", func(e *attestation.Evidence, _ *attestation.Options) { e.KeyPublic = ev2.KeyPublic }, attestation.CheckCertifiedName},
		{"tampered creation data", func(e *attestation.Evidence, _ *attestation.Options) { e.CreationData = flip(e.CreationData, 8) }, attestation.CheckCreationHash},
		{"wrong policy", func(_ *attestation.Evidence, o *attestation.Options) { o.AuthPolicies = [][]byte{qd("policy")} }, attestation.CheckKeyPolicy},
		{"wrong PCR values", func(_ *attestation.Evidence, o *attestation.Options) { o.PCRDigest = qd("golden") }, attestation.CheckPCRDigest},
		{"another PCR selection expected", func(_ *attestation.Evidence, o *attestation.Options) { o.PCRs = []int{7, 11} }, attestation.CheckPCRDigest},
		{"key differs from the CSR's", func(_ *attestation.Evidence, o *attestation.Options) { o.PublicKey = &other.PublicKey }, attestation.CheckKeyMatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := *ev
			o := attestation.Options{EKRoots: n.roots, QualifyingData: qd("csr"), PublicKey: n.key}
			tc.edit(&e, &o)
			_, err := attestation.Verify(&e, o)
			if got := attestation.FailedCheck(err); got != tc.want || !errors.Is(err, attestation.ErrRefused) {
				t.Fatalf("refused by %q (%v), want %q", got, err, tc.want)
			}
		})
	}
}

// TestImportedKeyNotAttestable: a key whose private half existed
// outside the TPM has no creation evidence and is not fixedTPM; the
// TPM side refuses to attest it and status says why.
func TestImportedKeyNotAttestable(t *testing.T) {
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	b := &tpm.Backend{Dial: sw.Dial}
	uri := "tpm:path=" + filepath.Join(t.TempDir(), "imp.tpmkey") + ";" + sw.URIAttrs()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	s, err := b.Import(ctx, uri, k)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ok, why := s.(*tpm.Signer).Attestability(); ok || why == "" {
		t.Fatalf("imported key attestable: %v %q", ok, why)
	}
	if _, err := b.Attest(ctx, uri, qd("csr")); !errors.Is(err, tpm.ErrNotAttestable) {
		t.Fatalf("got %v, want ErrNotAttestable", err)
	}
}

func flip(b []byte, i int) []byte {
	out := bytes.Clone(b)
	out[i] ^= 0x01
	return out
}

func clearRestricted(t *testing.T, raw []byte) []byte {
	t.Helper()
	p, err := tpm2.Unmarshal[tpm2.TPMTPublic](raw)
	if err != nil {
		t.Fatal(err)
	}
	p.ObjectAttributes.Restricted = false
	return tpm2.Marshal(p)
}

func selfSigned(t *testing.T) []byte {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another EK root"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
