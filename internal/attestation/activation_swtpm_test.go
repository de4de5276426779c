package attestation_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"testing"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/internal/attestation"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// TestSoftwareAKCannotActivate is why an activation proof means "the AK
// is in that TPM": a forger holding a genuine TPM can load the public
// area of its software AK (fixedTPM, restricted: TPM2_LoadExternal
// accepts any attributes without a private part, Part 3 §12.3), but the
// TPM will not authorize a public-only object for
// TPM2_ActivateCredential, neither by password nor by a policy the
// forger chose (TPM_RC_AUTH_UNAVAILABLE), so a credential sealed for
// that AK's name stays closed.
func TestSoftwareAKCannotActivate(t *testing.T) {
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	c, err := sw.Dial(context.Background(), sw.Device())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pol, err := tpm2.NewPolicyCalculator(tpm2.TPMAlgSHA256)
	if err != nil {
		t.Fatal(err)
	}
	if err := (tpm2.PolicyCommandCode{Code: tpm2.TPMCCActivateCredential}).Update(pol); err != nil {
		t.Fatal(err)
	}
	ccPolicy := tpm2.Policy(tpm2.TPMAlgSHA256, 16, func(tp transport.TPM, s tpm2.TPMISHPolicy, _ tpm2.TPM2BNonce) error {
		_, err := tpm2.PolicyCommandCode{PolicySession: s, Code: tpm2.TPMCCActivateCredential}.Execute(tp)
		return err
	})
	ek, err := tpm2.CreatePrimary{PrimaryHandle: tpm2.TPMRHEndorsement, InPublic: tpm2.New2B(tpm2.RSAEKTemplate)}.Execute(c)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = tpm2.FlushContext{FlushHandle: ek.ObjectHandle}.Execute(c) }()
	for name, tc := range map[string]struct {
		adminWithPolicy bool
		policy          []byte
		auth            tpm2.Session
	}{
		"password":        {auth: tpm2.PasswordAuth(nil)},
		"forger's policy": {adminWithPolicy: true, policy: pol.Hash().Digest, auth: ccPolicy},
	} {
		t.Run(name, func(t *testing.T) {
			ak := softwareAK(t, tc.adminWithPolicy, tc.policy)
			ext, err := tpm2.LoadExternal{InPublic: tpm2.New2B(ak), Hierarchy: tpm2.TPMRHNull}.Execute(c)
			if err != nil {
				t.Fatalf("LoadExternal of the software AK: %v", err)
			}
			defer func() { _, _ = tpm2.FlushContext{FlushHandle: ext.ObjectHandle}.Execute(c) }()
			sealed, err := attestation.Seal(nil, &attestation.Evidence{EKPublic: ek.OutPublic.Bytes(), AKPublic: tpm2.Marshal(ak)}, []byte("intermediate"))
			if err != nil {
				t.Fatal(err)
			}
			err = activateRetrying(c, ext, ek, sealed, tc.auth)
			if !errors.Is(err, tpm2.TPMRCAuthUnavailable) {
				t.Fatalf("ActivateCredential for a public-only software AK: %v, want TPM_RC_AUTH_UNAVAILABLE", err)
			}
		})
	}
}

// softwareAK is the public area a forger presents as its AK.
func softwareAK(t *testing.T, adminWithPolicy bool, policy []byte) tpm2.TPMTPublic {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p, err := tpmsim.ECCPublic(&k.PublicKey, tpm2.TPMAObject{
		FixedTPM: true, FixedParent: true, SensitiveDataOrigin: true, UserWithAuth: true, AdminWithPolicy: adminWithPolicy, Restricted: true, SignEncrypt: true,
	}, policy)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// activateRetrying runs TPM2_ActivateCredential with the EK's policy,
// retrying TPM_RC_RETRY (swtpm's self-test on first use).
func activateRetrying(c transport.TPM, ak *tpm2.LoadExternalResponse, ek *tpm2.CreatePrimaryResponse, s *attestation.Sealed, auth tpm2.Session) error {
	ekAuth := tpm2.Policy(tpm2.TPMAlgSHA256, 16, func(tp transport.TPM, sess tpm2.TPMISHPolicy, n tpm2.TPM2BNonce) error {
		_, err := tpm2.PolicySecret{AuthHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHEndorsement, Auth: tpm2.PasswordAuth(nil)}, PolicySession: sess, NonceTPM: n}.Execute(tp)
		return err
	})
	var err error
	for range 5 {
		_, err = tpm2.ActivateCredential{
			ActivateHandle: tpm2.AuthHandle{Handle: ak.ObjectHandle, Name: ak.Name, Auth: auth},
			KeyHandle:      tpm2.AuthHandle{Handle: ek.ObjectHandle, Name: ek.Name, Auth: ekAuth},
			CredentialBlob: tpm2.TPM2BIDObject{Buffer: s.IDObject},
			Secret:         tpm2.TPM2BEncryptedSecret{Buffer: s.EncryptedSecret},
		}.Execute(c)
		if !errors.Is(err, tpm2.TPMRCRetry) {
			return err
		}
	}
	return err
}
