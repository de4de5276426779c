// Package attestation verifies that a CA key lives in a genuine TPM: the
// evidence a node's TPM produces (its EK certificate, an attestation key,
// and a TPM2_CertifyCreation of the CA key by that AK, TPM 2.0 Part 3
// §18.3), checked from bytes alone by the offline root or an auditor, and
// the credential that binds the AK to the EK (TPM2_MakeCredential
// semantics, Part 3 §12.6), used to deliver a signed certificate that only
// that TPM can open. It does no device I/O: signer/tpm produces the
// evidence and runs TPM2_ActivateCredential.
package attestation

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// EvidenceVersion is the version of the evidence format this package
// writes and reads.
const EvidenceVersion = 1

// MaxFileSize bounds an evidence, request or sealed file read from disk.
const MaxFileSize = 1 << 20

// Evidence is what a node's TPM presents about one of its keys. Every
// field holds the exact bytes the TPM produced (encoding/json writes
// them in base64), so the verifier hashes what the TPM hashed.
type Evidence struct {
	Version int `json:"version"`
	// EKCertificate is the DER endorsement key certificate the TPM holds
	// in NV (index 0x01c00002, TCG EK Credential Profile §2.2.1.5.2).
	EKCertificate []byte `json:"ekCertificate"`
	// EKChain holds DER intermediates the TPM stores in NV, if any.
	EKChain [][]byte `json:"ekChain,omitempty"`
	// EKPublic is the TPMT_PUBLIC of the RSA EK (TCG template).
	EKPublic []byte `json:"ekPublic"`
	// AKPublic is the TPMT_PUBLIC of the attestation key.
	AKPublic []byte `json:"akPublic"`
	// KeyPublic is the TPMT_PUBLIC of the attested key.
	KeyPublic []byte `json:"keyPublic"`
	// CreationData is the TPMS_CREATION_DATA TPM2_Create returned.
	CreationData []byte `json:"creationData"`
	// Attest is the TPMS_ATTEST of TPM2_CertifyCreation, Signature the
	// AK's TPMT_SIGNATURE over it.
	Attest    []byte `json:"attest"`
	Signature []byte `json:"signature"`
}

// Marshal encodes e as indented JSON.
func (e *Evidence) Marshal() ([]byte, error) { return marshalFile(e, "attestation evidence") }

// marshalFile encodes one of this package's files as indented JSON.
func marshalFile(v any, what string) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", what, err)
	}
	return append(b, '\n'), nil
}

// ParseEvidence decodes evidence written by Marshal.
func ParseEvidence(data []byte) (*Evidence, error) {
	var e Evidence
	if err := decodeStrict(data, &e); err != nil {
		return nil, fmt.Errorf("decode attestation evidence: %w", err)
	}
	if e.Version != EvidenceVersion {
		return nil, fmt.Errorf("attestation evidence version %d is not %d", e.Version, EvidenceVersion)
	}
	return &e, nil
}

// decodeStrict decodes one JSON value with no unknown fields and nothing
// after it.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}
