package attestation

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/google/go-tpm/tpm2"
)

// SealedVersion is the version of the sealed-credential format.
const SealedVersion = 1

// Sealed is a payload (a signed certificate, an auditor's challenge)
// that only the TPM holding a given EK and AK can open. Its credential,
// an AES-256 key, is encrypted with TPM2_MakeCredential semantics (TPM
// 2.0 Part 1 §24, go-tpm CreateCredential) to the EK for the AK's name;
// TPM2_ActivateCredential releases it only when that AK is loaded in the
// TPM whose EK decrypts the seed. The payload is AES-256-GCM under it,
// with the AK name as additional data.
type Sealed struct {
	Version int `json:"version"`
	// AKName is the name of the AK the credential is bound to.
	AKName []byte `json:"akName"`
	// EKName is the TPM name of the EK the credential is sealed to, and
	// EKCertificate the hex SHA-256 of its certificate: they let a TPM
	// that holds another EK say so before it tries (absent in files
	// written before they were added).
	EKName        []byte `json:"ekName,omitempty"`
	EKCertificate string `json:"ekCertificate,omitempty"`
	// IDObject and EncryptedSecret are TPM2_MakeCredential's outputs
	// (TPM2B_ID_OBJECT and TPM2B_ENCRYPTED_SECRET contents).
	IDObject        []byte `json:"idObject"`
	EncryptedSecret []byte `json:"encryptedSecret"`
	Nonce           []byte `json:"nonce"`
	Ciphertext      []byte `json:"ciphertext"`
}

// Seal encrypts payload to the EK and AK of verified evidence (the EK
// area must have passed Verify). r nil means crypto/rand.
func Seal(r io.Reader, e *Evidence, payload []byte) (*Sealed, error) {
	if r == nil {
		r = rand.Reader
	}
	ek, err := unmarshalPublic(e.EKPublic)
	if err != nil {
		return nil, fmt.Errorf("seal: EK public area: %w", err)
	}
	encap, err := tpm2.ImportEncapsulationKey(ek)
	if err != nil {
		return nil, fmt.Errorf("seal: EK public key: %w", err)
	}
	secret := make([]byte, 32)
	if _, err := io.ReadFull(r, secret); err != nil {
		return nil, fmt.Errorf("seal: random: %w", err)
	}
	akName := nameOf(e.AKPublic)
	idObject, encSecret, err := tpm2.CreateCredential(r, encap, akName, secret)
	if err != nil {
		return nil, fmt.Errorf("seal: make credential: %w", err)
	}
	aead, err := newAEAD(secret)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := io.ReadFull(r, nonce); err != nil {
		return nil, fmt.Errorf("seal: random: %w", err)
	}
	ekSum := sha256.Sum256(e.EKCertificate)
	return &Sealed{
		Version: SealedVersion, AKName: akName, IDObject: idObject, EncryptedSecret: encSecret,
		EKName: nameOf(e.EKPublic), EKCertificate: hex.EncodeToString(ekSum[:]),
		Nonce: nonce, Ciphertext: aead.Seal(nil, nonce, payload, akName),
	}, nil
}

// Open decrypts the payload with the credential TPM2_ActivateCredential
// returned.
func (s *Sealed) Open(credential []byte) ([]byte, error) {
	aead, err := newAEAD(credential)
	if err != nil {
		return nil, err
	}
	if len(s.Nonce) != aead.NonceSize() {
		return nil, refuse(CheckCredential, "nonce is %d bytes, want %d", len(s.Nonce), aead.NonceSize())
	}
	out, err := aead.Open(nil, s.Nonce, s.Ciphertext, s.AKName)
	if err != nil {
		return nil, refuse(CheckCredential, "the payload does not decrypt with the activated credential (tampered file)")
	}
	return out, nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	if len(key) != 32 {
		return nil, refuse(CheckCredential, "credential is %d bytes, want 32", len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// Marshal encodes s as indented JSON.
func (s *Sealed) Marshal() ([]byte, error) { return marshalFile(s, "sealed credential") }

// ParseSealed decodes a sealed credential written by Marshal.
func ParseSealed(data []byte) (*Sealed, error) {
	var s Sealed
	if err := decodeStrict(data, &s); err != nil {
		return nil, fmt.Errorf("decode sealed credential: %w", err)
	}
	if s.Version != SealedVersion {
		return nil, fmt.Errorf("sealed credential version %d is not %d", s.Version, SealedVersion)
	}
	if len(s.AKName) == 0 || len(s.IDObject) == 0 || len(s.EncryptedSecret) == 0 {
		return nil, errors.New("sealed credential lacks its AK name, ID object or encrypted secret")
	}
	return &s, nil
}
