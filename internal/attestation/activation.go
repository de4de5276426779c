package attestation

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"io"
)

// Attested enrolment proves two things: the evidence (Verify, from bytes
// alone) and activation: that the TPM named by the evidence really
// opened the sealed intermediate. Software can forge evidence around a
// borrowed EK certificate (a software AK and key pass every check of
// Verify), but it cannot run TPM2_ActivateCredential with that EK (TPM
// 2.0 Part 1 §24), so the root records an enrolment as attested only
// once the node returns the activation secret sealed with the
// certificate.

// EnrolmentVersion is the version of Enrolment.
const EnrolmentVersion = 1

// Enrolment is the payload the root seals to a node's EK and AK: the
// signed intermediate and a fresh activation secret. The root keeps
// only ActivationCommitment(secret); the node proves activation by
// returning the secret (ActivationProof).
type Enrolment struct {
	Version int `json:"version"`
	// Chain is the PEM certificate chain, the intermediate first.
	Chain []byte `json:"chain"`
	// ActivationSecret is ChallengeSize random bytes.
	ActivationSecret []byte `json:"activationSecret"`
}

// NewEnrolment wraps chainPEM with a fresh activation secret (r nil
// means crypto/rand).
func NewEnrolment(r io.Reader, chainPEM []byte) (*Enrolment, error) {
	if r == nil {
		r = rand.Reader
	}
	secret := make([]byte, ChallengeSize)
	if _, err := io.ReadFull(r, secret); err != nil {
		return nil, fmt.Errorf("enrolment: random: %w", err)
	}
	return &Enrolment{Version: EnrolmentVersion, Chain: chainPEM, ActivationSecret: secret}, nil
}

// Marshal encodes e as indented JSON.
func (e *Enrolment) Marshal() ([]byte, error) { return marshalFile(e, "enrolment") }

// ParseEnrolment decodes the payload of a sealed intermediate.
func ParseEnrolment(data []byte) (*Enrolment, error) {
	var e Enrolment
	if err := decodeStrict(data, &e); err != nil {
		return nil, fmt.Errorf("decode the sealed enrolment (made by an older intermediate sign? sign the request again): %w", err)
	}
	if e.Version != EnrolmentVersion || len(e.Chain) == 0 || len(e.ActivationSecret) != ChallengeSize {
		return nil, fmt.Errorf("the sealed enrolment is not version %d with a chain and a %d-byte activation secret", EnrolmentVersion, ChallengeSize)
	}
	return &e, nil
}

// ActivationCommitment is what the root records of an activation
// secret: SHA-256 over a label and the secret. It reveals nothing that
// would let anyone produce the secret.
func ActivationCommitment(secret []byte) string {
	h := sha256.New()
	h.Write([]byte("steward-trustd activation v1\x00"))
	h.Write(secret)
	return hex.EncodeToString(h.Sum(nil))
}

// ActivationProofVersion is the version of ActivationProof.
const ActivationProofVersion = 1

// ActivationProof is what `intermediate install` writes for the root:
// the certificate it installed and the activation secret only the TPM
// the enrolment was sealed to could release.
type ActivationProof struct {
	Version int `json:"version"`
	// Certificate is the hex SHA-256 of the installed intermediate's DER.
	Certificate string `json:"certificate"`
	// Secret is the enrolment's ActivationSecret.
	Secret []byte `json:"secret"`
}

// Marshal encodes p as indented JSON.
func (p *ActivationProof) Marshal() ([]byte, error) { return marshalFile(p, "activation proof") }

// ParseActivationProof decodes an activation proof file.
func ParseActivationProof(data []byte) (*ActivationProof, error) {
	var p ActivationProof
	if err := decodeStrict(data, &p); err != nil {
		return nil, fmt.Errorf("decode activation proof: %w", err)
	}
	if p.Version != ActivationProofVersion || len(p.Certificate) != 2*sha256.Size || len(p.Secret) != ChallengeSize {
		return nil, fmt.Errorf("activation proof is not version %d with a certificate fingerprint and a %d-byte secret", ActivationProofVersion, ChallengeSize)
	}
	return &p, nil
}

// Check compares the proof with the commitment the root recorded when it
// sealed the enrolment.
func (p *ActivationProof) Check(commitment string) error {
	if subtle.ConstantTimeCompare([]byte(ActivationCommitment(p.Secret)), []byte(commitment)) != 1 {
		return refuse(CheckActivation, "the proof's secret is not the one sealed with certificate %s: the sealed intermediate was not opened by the TPM it was sealed to", p.Certificate)
	}
	return nil
}
