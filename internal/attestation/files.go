package attestation

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"strings"
)

// CSRQualifyingData is the qualifying data of an enrolment: SHA-256 of
// the CSR's DER, so that the evidence vouches for exactly that request.
func CSRQualifyingData(csrDER []byte) []byte {
	sum := sha256.Sum256(csrDER)
	return sum[:]
}

// CAQualifyingData is the qualifying data of an audit of an existing CA
// key: SHA-256 over a label, the CA certificate's DER and the auditor's
// nonce (which makes the evidence fresh).
func CAQualifyingData(caDER, nonce []byte) []byte {
	h := sha256.New()
	h.Write([]byte("steward-trustd attest v1\x00"))
	h.Write(caDER)
	h.Write(nonce)
	return h.Sum(nil)
}

// CAEvidenceVersion is the version of CAEvidence.
const CAEvidenceVersion = 1

// CAEvidence is what `attest` writes on the TPM host for an auditor:
// the CA certificate, the auditor's nonce and the TPM's evidence over
// CAQualifyingData of both.
type CAEvidence struct {
	Version     int       `json:"version"`
	Certificate []byte    `json:"certificate"` // DER
	Nonce       []byte    `json:"nonce"`
	Evidence    *Evidence `json:"evidence"`
}

// ParseCAEvidence decodes a CAEvidence file.
func ParseCAEvidence(data []byte) (*CAEvidence, error) {
	var e CAEvidence
	if err := decodeStrict(data, &e); err != nil {
		return nil, fmt.Errorf("decode CA attestation: %w", err)
	}
	if e.Version != CAEvidenceVersion || e.Evidence == nil || e.Evidence.Version != EvidenceVersion {
		return nil, fmt.Errorf("CA attestation is not version %d with version %d evidence", CAEvidenceVersion, EvidenceVersion)
	}
	return &e, nil
}

// ChallengeSize is the size of an auditor's activation challenge.
const ChallengeSize = 32

// EncodeSecret renders an activation secret or response as one hex line.
func EncodeSecret(b []byte) []byte { return []byte(hex.EncodeToString(b) + "\n") }

// CheckResponse compares the node's activation response with the
// auditor's secret, both as EncodeSecret wrote them.
func CheckResponse(secret, response []byte) error {
	s, err := hex.DecodeString(strings.TrimSpace(string(secret)))
	if err != nil || len(s) != ChallengeSize {
		return fmt.Errorf("the challenge's secret file is not %d hex bytes; re-run verify-attestation --challenge-out", ChallengeSize)
	}
	r, err := hex.DecodeString(strings.TrimSpace(string(response)))
	if err != nil || subtle.ConstantTimeCompare(s, r) != 1 {
		return refuse(CheckCredential, "the response is not the challenge's secret: the TPM that answered does not hold this EK and AK")
	}
	return nil
}

// RequestVersion is the version of Request.
const RequestVersion = 1

// Request is an attested enrolment request (`intermediate request
// --attest`): the CSR and the TPM's evidence over CSRQualifyingData(CSR)
// for the CSR's key.
type Request struct {
	Version  int       `json:"version"`
	CSR      []byte    `json:"csr"` // DER
	Evidence *Evidence `json:"evidence"`
}

// ParseRequest decodes an attested request file.
func ParseRequest(data []byte) (*Request, error) {
	var r Request
	if err := decodeStrict(data, &r); err != nil {
		return nil, fmt.Errorf("decode attested request: %w", err)
	}
	if r.Version != RequestVersion || r.Evidence == nil || r.Evidence.Version != EvidenceVersion || len(r.CSR) == 0 {
		return nil, fmt.Errorf("attested request is not version %d with a CSR and version %d evidence", RequestVersion, EvidenceVersion)
	}
	return &r, nil
}
