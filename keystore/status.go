package keystore

import (
	"context"
	"crypto/x509"
	"fmt"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
)

// Status is what `status` reports.
type Status struct {
	// Key describes the CA key (backend, algorithm, fingerprint,
	// extractability, PCR policy and its digest).
	Key signer.Description `json:"key"`
	// PolicyChecked is true when the backend can evaluate its policy
	// (TPM); PolicySatisfied and PolicyError then say whether the current
	// PCR values let the key be used.
	PolicyChecked   bool   `json:"policyChecked"`
	PolicySatisfied bool   `json:"policySatisfied"`
	PolicyError     string `json:"policyError,omitempty"`
	// Attestable says whether a TPM can prove the key resides in it
	// (created there, creation evidence kept: see `attest`);
	// Attestation says why or why not.
	Attestable  bool   `json:"attestable"`
	Attestation string `json:"attestation"`
	// SignedPolicy reports on a TPM key under policy authorities: the
	// authorities' names and fingerprints, the current PCR state and
	// which approval matches it.
	SignedPolicy *tpm.PolicyReport `json:"signedPolicy,omitempty"`
	// CA describes the CA certificate, when one was given.
	CA *CAStatus `json:"ca,omitempty"`
	// Receipts are the ceremony directory's receipts, oldest first.
	Receipts []Receipt `json:"receipts"`
	// ReceiptsError reports unreadable receipts.
	ReceiptsError string `json:"receiptsError,omitempty"`
}

// CAStatus describes a CA certificate and its relation to the key.
type CAStatus struct {
	Subject     string    `json:"subject"`
	Fingerprint string    `json:"fingerprint"`
	NotBefore   time.Time `json:"notBefore"`
	NotAfter    time.Time `json:"notAfter"`
	Expired     bool      `json:"expired"`
	KeyMatches  bool      `json:"keyMatches"`
}

// policyReporter is implemented by TPM signers (*tpm.Signer).
type policyReporter interface {
	PolicyReport(ctx context.Context) (*tpm.PolicyReport, error)
}

// Status opens the key at uri (it does not sign) and reports on it, on ca
// if given, and on the receipts in d (nil d lists none).
func (c *Ceremony) Status(ctx context.Context, uri string, ca *x509.Certificate, d Dir) (*Status, error) {
	s, err := c.Keys.Open(ctx, uri)
	if err != nil {
		return nil, fmt.Errorf("status: open key: %w", err)
	}
	defer s.Close()
	st := &Status{Key: s.Describe(), Receipts: []Receipt{}}
	st.Attestable, st.Attestation = attestability(s)
	if pc, ok := s.(PolicyChecker); ok {
		st.PolicyChecked = true
		if err := pc.CheckPolicy(ctx); err != nil {
			st.PolicyError = err.Error()
		} else {
			st.PolicySatisfied = true
		}
	}
	if pr, ok := s.(policyReporter); ok {
		if st.SignedPolicy, err = pr.PolicyReport(ctx); err != nil {
			return nil, fmt.Errorf("status: signed policy: %w", err)
		}
	}
	if ca != nil {
		now := c.now()
		st.CA = &CAStatus{
			Subject:     ca.Subject.String(),
			Fingerprint: pki.CertFingerprint(ca),
			NotBefore:   ca.NotBefore.UTC(),
			NotAfter:    ca.NotAfter.UTC(),
			Expired:     now.After(ca.NotAfter) || now.Before(ca.NotBefore),
			KeyMatches:  pki.KeyMatchesCert(s.Public(), ca),
		}
	}
	if d != nil {
		rs, err := ReadReceipts(d)
		if err != nil {
			st.ReceiptsError = err.Error()
		}
		if rs != nil {
			st.Receipts = rs
		}
	}
	return st, nil
}
