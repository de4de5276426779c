package attestation_test

import (
	"crypto/ecdsa"
	"testing"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/internal/attestation"
)

// TestVerifyRefusesKeyAttributes: genuine TPM evidence, certified by
// the TPM itself, of keys the CA must not be: duplicable (fixedTPM and
// fixedParent clear), usable with its auth value (userWithAuth set), a
// restricted key. Each is refused by key-attributes.
func TestVerifyRefusesKeyAttributes(t *testing.T) {
	n := newNode(t)
	base, err := n.b.Attest(ctx, n.uri, qd("csr"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		edit func(a *tpm2.TPMAObject)
	}{
		{"duplicable", func(a *tpm2.TPMAObject) { a.FixedTPM, a.FixedParent = false, false }},
		{"userWithAuth", func(a *tpm2.TPMAObject) { a.UserWithAuth = true }},
		{"no adminWithPolicy", func(a *tpm2.TPMAObject) { a.AdminWithPolicy = false }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := n.sw.Dial(ctx, n.sw.Device())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ev, pub := certifyRaw(t, c, tc.edit, base)
			_, err = attestation.Verify(ev, attestation.Options{EKRoots: n.roots, QualifyingData: qd("csr"), PublicKey: pub})
			if got := attestation.FailedCheck(err); got != attestation.CheckKeyAttributes {
				t.Fatalf("refused by %q (%v), want key-attributes", got, err)
			}
		})
	}
}

// certifyRaw creates, under the SRK, a P-256 signing key with the CA
// template edited by edit, has the AK certify its creation, and returns
// evidence that differs from base only in that key.
func certifyRaw(t *testing.T, c transport.TPM, edit func(*tpm2.TPMAObject), base *attestation.Evidence) (*attestation.Evidence, *ecdsa.PublicKey) {
	t.Helper()
	owner := tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)}
	srk, err := tpm2.CreatePrimary{PrimaryHandle: owner, InPublic: tpm2.New2B(tpm2.ECCSRKTemplate)}.Execute(c)
	if err != nil {
		t.Fatal(err)
	}
	defer flushRaw(c, srk.ObjectHandle)
	tmpl := tpm2.TPMTPublic{
		Type: tpm2.TPMAlgECC, NameAlg: tpm2.TPMAlgSHA256,
		ObjectAttributes: tpm2.TPMAObject{FixedTPM: true, FixedParent: true, SensitiveDataOrigin: true, AdminWithPolicy: true, NoDA: true, SignEncrypt: true},
		AuthPolicy:       tpm2.TPM2BDigest{Buffer: make([]byte, 32)},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
			Symmetric: tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull}, Scheme: tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgNull},
			CurveID: tpm2.TPMECCNistP256, KDF: tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{}),
	}
	edit(&tmpl.ObjectAttributes)
	parent := tpm2.AuthHandle{Handle: srk.ObjectHandle, Name: srk.Name, Auth: tpm2.PasswordAuth(nil)}
	cr, err := tpm2.Create{ParentHandle: parent, InPublic: tpm2.New2B(tmpl), CreationPCR: tpm2.TPMLPCRSelection{}}.Execute(c)
	if err != nil {
		t.Fatal(err)
	}
	key, err := tpm2.Load{ParentHandle: parent, InPrivate: cr.OutPrivate, InPublic: cr.OutPublic}.Execute(c)
	if err != nil {
		t.Fatal(err)
	}
	defer flushRaw(c, key.ObjectHandle)
	akPub, err := tpm2.Unmarshal[tpm2.TPMTPublic](base.AKPublic)
	if err != nil {
		t.Fatal(err)
	}
	akPub.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{X: tpm2.TPM2BECCParameter{Buffer: []byte{}}, Y: tpm2.TPM2BECCParameter{Buffer: []byte{}}})
	ak, err := tpm2.CreatePrimary{PrimaryHandle: owner, InPublic: tpm2.New2B(*akPub)}.Execute(c)
	if err != nil {
		t.Fatal(err)
	}
	defer flushRaw(c, ak.ObjectHandle)
	rsp, err := tpm2.CertifyCreation{
		SignHandle:     tpm2.AuthHandle{Handle: ak.ObjectHandle, Name: ak.Name, Auth: tpm2.PasswordAuth(nil)},
		ObjectHandle:   tpm2.NamedHandle{Handle: key.ObjectHandle, Name: key.Name},
		QualifyingData: tpm2.TPM2BData{Buffer: qd("csr")},
		CreationHash:   cr.CreationHash, InScheme: tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgNull}, CreationTicket: cr.CreationTicket,
	}.Execute(c)
	if err != nil {
		t.Fatal(err)
	}
	ev := *base
	ev.KeyPublic, ev.CreationData = cr.OutPublic.Bytes(), cr.CreationData.Bytes()
	ev.Attest, ev.Signature = rsp.CertifyInfo.Bytes(), tpm2.Marshal(rsp.Signature)
	pub, _ := cr.OutPublic.Contents()
	parms, _ := pub.Parameters.ECCDetail()
	pt, _ := pub.Unique.ECC()
	ecPub, err := tpm2.ECDSAPub(parms, pt)
	if err != nil {
		t.Fatal(err)
	}
	return &ev, ecPub
}

func flushRaw(c transport.TPM, h tpm2.TPMHandle) {
	_, _ = tpm2.FlushContext{FlushHandle: h}.Execute(c)
}
