package keystore

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/steward-trustd/steward-trustd/internal/attestation"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// Attester is the TPM side of key attestation (signer/tpm's Backend):
// evidence for a key, and TPM2_ActivateCredential of a sealed credential.
type Attester interface {
	Attest(ctx context.Context, uri string, qualifyingData []byte) (*attestation.Evidence, error)
	ActivateCredential(ctx context.Context, uri string, s *attestation.Sealed) ([]byte, error)
}

// refusal records a refused verification (no file but the receipt) and
// returns cause, so that the caller exits non-zero naming the check.
func (c *Ceremony) refusal(receipts Dir, op Operation, details map[string]string, cause error) error {
	details["outcome"] = "refused"
	details["check"] = string(attestation.FailedCheck(cause))
	details["reason"] = cause.Error()
	if _, err := c.record(receipts, &plan{receipt: Receipt{Operation: op, Details: details}}); err != nil {
		return errors.Join(cause, fmt.Errorf("record the refusal: %w", err))
	}
	return cause
}

// AttestOptions configures Attest.
type AttestOptions struct {
	// SignerURI names the CA key (tpm:path=…); CA is its certificate.
	SignerURI string
	CA        *x509.Certificate
	// Nonce is the auditor's nonce (1-64 bytes).
	Nonce []byte
	// TPM produces the evidence.
	TPM Attester
	// Out receives the attestation file; Force allows replacing it.
	Out   Target
	Force bool
}

// Attest has the TPM certify the creation of the CA key for an auditor
// (TPM2_CertifyCreation with CAQualifyingData(CA, nonce)) and writes the
// evidence with the CA certificate and nonce.
func (c *Ceremony) Attest(ctx context.Context, receipts Dir, o AttestOptions) (*Outcome, error) {
	if len(o.Nonce) == 0 || len(o.Nonce) > 64 {
		return nil, errors.New("attest: the auditor's nonce must be 1 to 64 bytes")
	}
	s, err := c.OpenCA(ctx, o.SignerURI, o.CA)
	if err != nil {
		return nil, fmt.Errorf("attest: %w", err)
	}
	desc := s.Describe()
	// The TPM attests the key in a session of its own: this one is done.
	if err := s.Close(); err != nil {
		return nil, fmt.Errorf("attest: close the CA key: %w", err)
	}
	ev, err := o.TPM.Attest(ctx, o.SignerURI, attestation.CAQualifyingData(o.CA.Raw, o.Nonce))
	if err != nil {
		return nil, fmt.Errorf("attest: %w", err)
	}
	data, err := marshalJSON(attestation.CAEvidence{Version: attestation.CAEvidenceVersion, Certificate: o.CA.Raw, Nonce: o.Nonce, Evidence: ev})
	if err != nil {
		return nil, err
	}
	r := newReceipt(opAttest, desc)
	certReceipt(&r, o.CA)
	out, err := c.record(receipts, &plan{receipt: r, outputs: []placement{{Dir: o.Out.Dir, File: File{Name: o.Out.Name, Data: data, Mode: 0o644}, Overwrite: o.Force}}})
	if err != nil {
		return nil, fmt.Errorf("attest: %w", err)
	}
	return out, nil
}

// RespondOptions configures AttestRespond.
type RespondOptions struct {
	// SignerURI names the TPM (and the key the challenge is about).
	SignerURI string
	TPM       Attester
	// Challenge is the auditor's sealed challenge file.
	Challenge []byte
	// Out receives the response; Force allows replacing it.
	Out   Target
	Force bool
}

// AttestRespond opens an auditor's challenge with TPM2_ActivateCredential
// and writes the secret it held: only the TPM with the attested EK and
// AK can.
func (c *Ceremony) AttestRespond(ctx context.Context, receipts Dir, o RespondOptions) (*Outcome, error) {
	sealed, err := attestation.ParseSealed(o.Challenge)
	if err != nil {
		return nil, fmt.Errorf("attest --challenge: %w", err)
	}
	secret, err := o.TPM.ActivateCredential(ctx, o.SignerURI, sealed)
	if err != nil {
		return nil, c.refusal(receipts, opAttestRespond, map[string]string{"akName": fmt.Sprintf("%x", sealed.AKName)}, fmt.Errorf("attest --challenge: %w", err))
	}
	r := Receipt{Operation: opAttestRespond, Backend: "tpm", Details: map[string]string{"akName": fmt.Sprintf("%x", sealed.AKName)}}
	out, err := c.record(receipts, &plan{receipt: r, outputs: []placement{{Dir: o.Out.Dir, File: File{Name: o.Out.Name, Data: attestation.EncodeSecret(secret), Mode: 0o600}, Overwrite: o.Force}}})
	if err != nil {
		return nil, fmt.Errorf("attest --challenge: %w", err)
	}
	return out, nil
}

// VerifyAttestationOptions configures VerifyAttestation.
type VerifyAttestationOptions struct {
	// Evidence is the file `attest` wrote.
	Evidence []byte
	// CA is the CA certificate the cluster trusts; Nonce the auditor's.
	CA    *x509.Certificate
	Nonce []byte
	// Expect holds the EK roots and the expected policy; its
	// QualifyingData and PublicKey are set from CA and Nonce.
	Expect attestation.Options
	// ChallengeOut receives the sealed activation challenge for the
	// node, and ChallengeOut.Name+".secret" (0600, stays here) its secret.
	ChallengeOut Target
	Force        bool
	// Secret and Response, when set, finish the round trip instead:
	// the node's response must equal the secret.
	Secret, Response []byte
}

// VerifyAttestation verifies `attest` evidence for CA from bytes alone,
// then either writes an activation challenge for the node or checks its
// response. Every outcome, refusals included, leaves a receipt.
func (c *Ceremony) VerifyAttestation(receipts Dir, o VerifyAttestationOptions) (*attestation.Result, *Outcome, error) {
	res, details, err := verifyCAEvidence(o)
	op := opVerifyAttest
	if o.Response != nil {
		op = opVerifyActivation
	}
	if err != nil {
		return nil, nil, c.refusal(receipts, op, details, fmt.Errorf("verify-attestation: %w", err))
	}
	if o.Response != nil {
		if err := attestation.CheckResponse(o.Secret, o.Response); err != nil {
			return nil, nil, c.refusal(receipts, op, details, fmt.Errorf("verify-attestation: %w", err))
		}
		details["outcome"] = "activated: the CA key is in the TPM holding this EK"
		out, err := c.record(receipts, &plan{receipt: caReceipt(op, o.CA, details)})
		return res, out, err
	}
	outputs, err := c.challengeFiles(o)
	if err != nil {
		return nil, nil, err
	}
	details["outcome"] = "verified; activation challenge written"
	out, err := c.record(receipts, &plan{receipt: caReceipt(op, o.CA, details), outputs: outputs})
	return res, out, err
}

// verifyCAEvidence decodes and verifies the evidence, returning the
// receipt details so far.
func verifyCAEvidence(o VerifyAttestationOptions) (*attestation.Result, map[string]string, error) {
	details := map[string]string{"caFingerprint": pki.CertFingerprint(o.CA)}
	ce, err := attestation.ParseCAEvidence(o.Evidence)
	if err != nil {
		return nil, details, err
	}
	exp := o.Expect
	exp.QualifyingData = attestation.CAQualifyingData(o.CA.Raw, o.Nonce)
	exp.PublicKey = o.CA.PublicKey
	res, err := attestation.Verify(ce.Evidence, exp)
	if err != nil {
		return nil, details, err
	}
	details["ekCertificate"], details["ekRoot"] = res.EK.SHA256, res.EK.Root
	details["akName"], details["keyName"], details["policy"] = res.AKName, res.KeyName, res.Policy
	return res, details, nil
}

// challengeFiles seals a fresh secret to the evidence's EK and AK.
func (c *Ceremony) challengeFiles(o VerifyAttestationOptions) ([]placement, error) {
	ce, err := attestation.ParseCAEvidence(o.Evidence)
	if err != nil {
		return nil, err
	}
	secret := make([]byte, attestation.ChallengeSize)
	if _, err := io.ReadFull(c.Rand, secret); err != nil {
		return nil, err
	}
	sealed, err := attestation.Seal(c.Rand, ce.Evidence, secret)
	if err != nil {
		return nil, err
	}
	data, err := sealed.Marshal()
	if err != nil {
		return nil, err
	}
	d := o.ChallengeOut.Dir
	return []placement{
		{Dir: d, File: File{Name: o.ChallengeOut.Name + ".secret", Data: attestation.EncodeSecret(secret), Mode: 0o600}, Overwrite: o.Force},
		{Dir: d, File: File{Name: o.ChallengeOut.Name, Data: data, Mode: 0o644}, Overwrite: o.Force},
	}, nil
}

func caReceipt(op Operation, ca *x509.Certificate, details map[string]string) Receipt {
	r := Receipt{Operation: op, Details: details}
	fp, err := signer.Fingerprint(ca.PublicKey)
	if err == nil {
		r.KeyFingerprint = fp
	}
	certReceipt(&r, ca)
	return r
}

func marshalJSON(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
