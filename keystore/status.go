package keystore

import (
	"context"
	"crypto"
	"crypto/x509"
	"fmt"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
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

// Status opens the key at uri (it does not sign) and reports on it, on ca
// if given, on the issuer chain if given (tiered setup), and on the
// receipts in d (nil d lists none).
func (c *Ceremony) Status(ctx context.Context, uri string, ca *x509.Certificate, d Dir, chain ...*x509.Certificate) (*Status, error) {
	s, err := c.Keys.Open(ctx, uri)
	if err != nil {
		return nil, fmt.Errorf("status: open key: %w", err)
	}
	defer s.Close()
	st := &Status{Key: s.Describe(), Receipts: []Receipt{}}
	if pc, ok := s.(PolicyChecker); ok {
		st.PolicyChecked = true
		if err := pc.CheckPolicy(ctx); err != nil {
			st.PolicyError = err.Error()
		} else {
			st.PolicySatisfied = true
		}
	}
	now := c.now()
	if ca != nil {
		cs := certStatus(ca, s.Public(), now)
		st.CA = &cs
	}
	for _, ic := range chain {
		st.Chain = append(st.Chain, certStatus(ic, s.Public(), now))
	}
	if len(chain) > 0 && ca != nil {
		if err := pki.CheckIssuerChain(chain, []*x509.Certificate{ca}, s.Public(), now); err != nil {
			st.ChainError = err.Error()
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
