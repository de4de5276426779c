package server

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"fmt"

	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer"
)

// Credentials are the inputs that may change while the server runs: the
// worker token, the issuing CA certificate and the CA bundle returned to
// workers. Values are immutable once built; reload swaps the whole set.
type Credentials struct {
	tokens tokenSet
	ca     *x509.Certificate
	bundle []byte
	pool   *x509.CertPool
}

// NewCredentials checks and assembles credentials. token holds one or more
// worker tokens, one per line, all valid. caPEM is the issuing OS
// CA certificate, which must hold the signer's public key; acceptedPEM
// (optional) adds the CAs that may also authenticate talosctl, e.g. during
// a rotation. The bundle returned to workers becomes apid's client-CA
// pool, so every block in it must be a CA certificate allowing ClientAuth.
func NewCredentials(token []byte, caPEM, acceptedPEM []byte, pub crypto.PublicKey) (*Credentials, error) {
	tokens, err := parseTokens(token)
	if err != nil {
		return nil, err
	}
	cas, err := parseCAs(caPEM)
	if err != nil {
		return nil, fmt.Errorf("OS CA certificate: %w", err)
	}
	if len(cas) != 1 {
		return nil, fmt.Errorf("OS CA certificate: want exactly one certificate, found %d (put extra CAs in accepted-cas.crt)", len(cas))
	}
	ca := cas[0]
	if pub != nil {
		want, err := signer.Fingerprint(pub)
		if err != nil {
			return nil, err
		}
		got, err := signer.Fingerprint(ca.PublicKey)
		if err != nil {
			return nil, err
		}
		if want != got {
			return nil, fmt.Errorf("OS CA certificate does not match the signer's key (certificate key %s, signer key %s)", got[:16], want[:16])
		}
	}
	bundle := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if len(bytes.TrimSpace(acceptedPEM)) > 0 {
		extra, err := parseCAs(acceptedPEM)
		if err != nil {
			return nil, fmt.Errorf("accepted CAs: %w", err)
		}
		for _, c := range extra {
			if bytes.Equal(c.Raw, ca.Raw) {
				continue
			}
			bundle = append(bundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
			pool.AddCert(c)
		}
	}
	return &Credentials{tokens: tokens, ca: ca, bundle: bundle, pool: pool}, nil
}

// Tokens is the number of valid worker tokens.
func (c *Credentials) Tokens() int { return c.tokens.len() }

// CA returns the issuing CA certificate.
func (c *Credentials) CA() *x509.Certificate { return c.ca }

// Bundle returns the PEM bundle returned to workers as `ca`.
func (c *Credentials) Bundle() []byte { return c.bundle }

// Pool returns the bundle as a certificate pool.
func (c *Credentials) Pool() *x509.CertPool { return c.pool }

// parseCAs parses a PEM bundle of CA certificates that may authenticate
// talosctl.
func parseCAs(data []byte) ([]*x509.Certificate, error) {
	certs, err := keystore.ParseCertificates(data)
	if err != nil {
		return nil, err
	}
	for _, c := range certs {
		if !c.IsCA || !c.BasicConstraintsValid {
			return nil, fmt.Errorf("certificate %q is not a CA", c.Subject)
		}
		if !allowsClientAuth(c) {
			return nil, fmt.Errorf("CA %q has an ExtKeyUsage without ClientAuth; talosctl certificates under it would be refused by apid", c.Subject)
		}
	}
	return certs, nil
}

func allowsClientAuth(c *x509.Certificate) bool {
	if len(c.ExtKeyUsage) == 0 && len(c.UnknownExtKeyUsage) == 0 {
		return true
	}
	for _, u := range c.ExtKeyUsage {
		if u == x509.ExtKeyUsageClientAuth || u == x509.ExtKeyUsageAny {
			return true
		}
	}
	return false
}
