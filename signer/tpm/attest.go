package tpm

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/internal/attestation"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// MaxQualifyingData bounds TPM2_CertifyCreation's qualifyingData (a
// TPM2B_DATA holds at most one digest of the largest hash, Part 2 §10.4.3).
const MaxQualifyingData = 64

// Attest produces the attestation evidence for the blob key uri names:
// the EK certificate from NV, the RSA EK's public area, the AK's, and a
// TPM2_CertifyCreation (Part 3 §18.3) of the key by the AK with
// qualifyingData (e.g. SHA-256 of a CSR) as extraData. The key needs no
// authorization for it: its policy, which allows only TPM2_Sign, is
// never used. Keys that cannot be attested fail with ErrNotAttestable.
func (b *Backend) Attest(ctx context.Context, uri string, qualifyingData []byte) (*attestation.Evidence, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	if len(qualifyingData) == 0 || len(qualifyingData) > MaxQualifyingData {
		return nil, fmt.Errorf("tpm: attest: qualifying data must be 1 to %d bytes", MaxQualifyingData)
	}
	blob, ce, err := attestableBlob(u)
	if err != nil {
		return nil, err
	}
	var ev *attestation.Evidence
	err = b.withConn(ctx, u, b.reclaiming(u, func(t transport.TPM) error {
		ev, err = attest(t, blob, ce, qualifyingData)
		return err
	}))
	if err != nil {
		return nil, fmt.Errorf("tpm: attest %s: %w", u.Path, err)
	}
	return ev, nil
}

// attestableBlob reads the key blob and its creation evidence, refusing
// handle keys and imported keys.
func attestableBlob(u KeyURI) (*tpmpolicy.KeyBlob, *creationEvidence, error) {
	if u.Path == "" {
		return nil, nil, fmt.Errorf("tpm: attest %s: %w: a persistent-handle key keeps no creation evidence", u, ErrNotAttestable)
	}
	km, err := readBlobFile(u)
	if err != nil {
		return nil, nil, err
	}
	pub, err := km.blob.Public.Contents()
	if err != nil {
		return nil, nil, err
	}
	if a := pub.ObjectAttributes; !a.SensitiveDataOrigin || !a.FixedTPM || !a.FixedParent {
		return nil, nil, fmt.Errorf("tpm: attest %s: %w: the key was imported (its private key existed outside the TPM)", u.Path, ErrNotAttestable)
	}
	name, err := tpm2.ObjectName(pub)
	if err != nil {
		return nil, nil, err
	}
	ce, err := readCreation(u.Path, name.Buffer)
	if err != nil {
		return nil, nil, fmt.Errorf("tpm: attest %s: %w", u.Path, err)
	}
	return km.blob, ce, nil
}

func attest(t transport.TPM, blob *tpmpolicy.KeyBlob, ce *creationEvidence, qd []byte) (*attestation.Evidence, error) {
	ev := &attestation.Evidence{Version: attestation.EvidenceVersion, CreationData: ce.CreationData}
	var err error
	if ev.EKCertificate, ev.EKChain, err = readEKCertificate(t); err != nil {
		return nil, err
	}
	if ev.EKPublic, err = ekPublic(t); err != nil {
		return nil, err
	}
	ticket, err := tpm2.Unmarshal[tpm2.TPMTTKCreation](ce.CreationTicket)
	if err != nil {
		return nil, fmt.Errorf("creation ticket: %w", err)
	}
	ak, err := createAK(t)
	if err != nil {
		return nil, err
	}
	defer flush(t, ak.ObjectHandle)
	key, name, err := loadBlob(t, blob)
	if err != nil {
		return nil, err
	}
	defer flush(t, key)
	rsp, err := tpm2.CertifyCreation{
		SignHandle:     tpm2.AuthHandle{Handle: ak.ObjectHandle, Name: ak.Name, Auth: tpm2.PasswordAuth(nil)},
		ObjectHandle:   tpm2.NamedHandle{Handle: key, Name: name},
		QualifyingData: tpm2.TPM2BData{Buffer: qd},
		CreationHash:   tpm2.TPM2BDigest{Buffer: ce.CreationHash},
		InScheme:       tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgNull},
		CreationTicket: *ticket,
	}.Execute(t)
	if err != nil {
		return nil, fmt.Errorf("certify the key's creation (TPM2_CertifyCreation): %w", err)
	}
	ev.AKPublic = ak.OutPublic.Bytes()
	ev.KeyPublic = blob.Public.Bytes()
	ev.Attest = rsp.CertifyInfo.Bytes()
	ev.Signature = tpm2.Marshal(rsp.Signature)
	return ev, nil
}

func createAK(t transport.TPM) (*tpm2.CreatePrimaryResponse, error) {
	rsp, err := tpm2.CreatePrimary{
		PrimaryHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
		InPublic:      tpm2.New2B(akTemplate()),
	}.Execute(t)
	if err != nil {
		return nil, fmt.Errorf("create attestation key (TPM2_CreatePrimary, owner hierarchy, empty owner password): %w", err)
	}
	return rsp, nil
}

// createEK creates the TCG RSA 2048 EK (EK Credential Profile template
// L-1) in the endorsement hierarchy; the caller flushes it.
func createEK(t transport.TPM) (*tpm2.CreatePrimaryResponse, error) {
	rsp, err := tpm2.CreatePrimary{
		PrimaryHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHEndorsement, Auth: tpm2.PasswordAuth(nil)},
		InPublic:      tpm2.New2B(tpm2.RSAEKTemplate),
	}.Execute(t)
	if err != nil {
		return nil, fmt.Errorf("create the RSA EK (TPM2_CreatePrimary, endorsement hierarchy, empty password): %w", err)
	}
	return rsp, nil
}

func ekPublic(t transport.TPM) ([]byte, error) {
	ek, err := createEK(t)
	if err != nil {
		return nil, err
	}
	flush(t, ek.ObjectHandle)
	return ek.OutPublic.Bytes(), nil
}

// ActivateCredential opens a credential sealed to this TPM's EK and AK
// (TPM2_ActivateCredential, Part 3 §12.5: the EK is authorized by its
// PolicySecret(TPM_RH_ENDORSEMENT) policy) and returns its payload. A
// credential sealed for another TPM fails here: its seed does not decrypt
// with this EK, or this TPM's AK has another name.
func (b *Backend) ActivateCredential(ctx context.Context, uri string, s *attestation.Sealed) ([]byte, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	var cred []byte
	err = b.withConn(ctx, u, b.reclaiming(u, func(t transport.TPM) error {
		cred, err = activate(t, s)
		return err
	}))
	if err != nil {
		return nil, fmt.Errorf("tpm: activate credential: %w", err)
	}
	return s.Open(cred)
}

// ErrOtherTPM reports a credential sealed for another TPM's keys.
var ErrOtherTPM = errors.New("the credential was sealed for another TPM's EK and attestation key")

func activate(t transport.TPM, s *attestation.Sealed) ([]byte, error) {
	ak, err := createAK(t)
	if err != nil {
		return nil, err
	}
	defer flush(t, ak.ObjectHandle)
	ek, err := createEK(t)
	if err != nil {
		return nil, err
	}
	defer flush(t, ek.ObjectHandle)
	if err := sameTPM(s, ek.Name.Buffer, ak.Name.Buffer); err != nil {
		return nil, err
	}
	rsp, err := tpm2.ActivateCredential{
		ActivateHandle: tpm2.AuthHandle{Handle: ak.ObjectHandle, Name: ak.Name, Auth: tpm2.PasswordAuth(nil)},
		KeyHandle:      tpm2.AuthHandle{Handle: ek.ObjectHandle, Name: ek.Name, Auth: tpm2.Policy(tpm2.TPMAlgSHA256, 16, ekPolicy)},
		CredentialBlob: tpm2.TPM2BIDObject{Buffer: s.IDObject},
		Secret:         tpm2.TPM2BEncryptedSecret{Buffer: s.EncryptedSecret},
	}.Execute(t)
	if err != nil {
		return nil, fmt.Errorf("TPM2_ActivateCredential (the sealed file names this TPM's EK and AK, so it was damaged or made for them by someone else): %w", err)
	}
	return rsp.CertInfo.Buffer, nil
}

// sameTPM refuses, before the TPM is asked, a credential whose EK or AK
// name is not this TPM's: the file was sealed to another TPM (or, for
// the AK, this TPM's owner hierarchy was cleared since the request).
func sameTPM(s *attestation.Sealed, ekName, akName []byte) error {
	if len(s.EKName) > 0 && !bytes.Equal(s.EKName, ekName) {
		return &attestation.CheckError{Check: attestation.CheckCredential, Err: fmt.Errorf(
			"%w: sealed to another TPM (this TPM's EK is %x, the evidence names EK %x, certificate sha256 %s); run install on the node whose TPM made the attested request",
			ErrOtherTPM, ekName, s.EKName, s.EKCertificate)}
	}
	if !bytes.Equal(s.AKName, akName) {
		return &attestation.CheckError{Check: attestation.CheckCredential, Err: fmt.Errorf(
			"%w: sealed to another TPM's attestation key (this TPM's AK is %x, the evidence names %x; if this is the right node, its owner hierarchy was cleared since the request: make a new attested request)",
			ErrOtherTPM, akName, s.AKName)}
	}
	return nil
}

// ekPolicy satisfies the TCG EK's authPolicy, PolicySecret(TPM_RH_ENDORSEMENT)
// with the empty endorsement password.
func ekPolicy(t transport.TPM, session tpm2.TPMISHPolicy, nonceTPM tpm2.TPM2BNonce) error {
	_, err := tpm2.PolicySecret{
		AuthHandle:    tpm2.AuthHandle{Handle: tpm2.TPMRHEndorsement, Auth: tpm2.PasswordAuth(nil)},
		PolicySession: session,
		NonceTPM:      nonceTPM,
	}.Execute(t)
	if err != nil {
		return fmt.Errorf("EK policy (TPM2_PolicySecret, endorsement hierarchy, empty password): %w", err)
	}
	return nil
}
