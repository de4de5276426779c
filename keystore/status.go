package keystore

import (
	"context"
	"crypto"
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
	// Chain describes the issuer chain (issuer.crt) of the tiered setup,
	// when one was given: the key's own certificate first. ChainError is
	// why the daemon would refuse it (pki.CheckIssuerChain against CA).
	Chain      []CAStatus `json:"chain,omitempty"`
	ChainError string     `json:"chainError,omitempty"`
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
	// EKU names the ExtKeyUsage (pki.DescribeEKU).
	EKU string `json:"eku"`
}

// KeyMatches reports whether the key is the signing certificate's: the
// first of the chain in the tiered setup, else the CA's.
func (st *Status) KeyMatches() bool {
	if len(st.Chain) > 0 {
		return st.Chain[0].KeyMatches
	}
	return st.CA != nil && st.CA.KeyMatches
}

func certStatus(c *x509.Certificate, pub crypto.PublicKey, now time.Time) CAStatus {
	return CAStatus{
		Subject:     c.Subject.String(),
		Fingerprint: pki.CertFingerprint(c),
		NotBefore:   c.NotBefore.UTC(),
		NotAfter:    c.NotAfter.UTC(),
		Expired:     now.After(c.NotAfter) || now.Before(c.NotBefore),
		KeyMatches:  pki.KeyMatchesCert(pub, c),
		EKU:         pki.DescribeEKU(c),
	}
}

// addCerts describes ca and the issuer chain against the key pub, and
// checks the chain as the daemon would.
func (st *Status) addCerts(ca *x509.Certificate, accepted, chain []*x509.Certificate, pub crypto.PublicKey, now time.Time) {
	if ca != nil {
		cs := certStatus(ca, pub, now)
		st.CA = &cs
	}
	for _, ic := range chain {
		st.Chain = append(st.Chain, certStatus(ic, pub, now))
	}
	if len(chain) > 0 && ca != nil {
		roots := append([]*x509.Certificate{ca}, accepted...)
		if err := pki.CheckIssuerChain(chain, roots, pub, now); err != nil {
			st.ChainError = err.Error()
		}
	}
}

// policyReporter is implemented by TPM signers (*tpm.Signer).
type policyReporter interface {
	PolicyReport(ctx context.Context) (*tpm.PolicyReport, error)
}

// Status opens the key at uri (it does not sign) and reports on it, on ca
// if given, on the issuer chain if given (tiered setup), and on the
// receipts in d (nil d lists none). It is StatusAccepting without
// accepted CAs.
func (c *Ceremony) Status(ctx context.Context, uri string, ca *x509.Certificate, d Dir, chain ...*x509.Certificate) (*Status, error) {
	return c.StatusAccepting(ctx, uri, ca, nil, d, chain...)
}

// StatusAccepting is Status with the cert dir's accepted CAs
// (accepted-cas.crt): the issuer chain is checked against ca and them,
// as the daemon checks it (an intermediate from the previous root
// verifies to accepted-cas.crt after a root rotation).
func (c *Ceremony) StatusAccepting(ctx context.Context, uri string, ca *x509.Certificate, accepted []*x509.Certificate, d Dir, chain ...*x509.Certificate) (_ *Status, err error) {
	s, err := c.Keys.Open(ctx, uri)
	if err != nil {
		return nil, fmt.Errorf("status: open key: %w", err)
	}
	defer closeKey(s, &err)
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
	st.addCerts(ca, accepted, chain, s.Public(), c.now())
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
