package server

import (
	"crypto"
	"crypto/x509"
	"fmt"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
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
	// bundleSize is how many CAs bundle holds, for logs.
	bundleSize int
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
	ca, cas, err := certdir.ParseBundle(caPEM, acceptedPEM)
	if err != nil {
		return nil, err
	}
	if pub != nil && !pki.KeyMatchesCert(pub, ca) {
		return nil, mismatch(ca, pub)
	}
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	bundle := pki.EncodeCertificates(cas...)
	return &Credentials{tokens: tokens, ca: ca, bundle: bundle, pool: pool, bundleSize: len(cas)}, nil
}

// Tokens is the number of valid worker tokens.
func (c *Credentials) Tokens() int { return c.tokens.len() }

// BundleSize is the number of CAs in Bundle.
func (c *Credentials) BundleSize() int { return c.bundleSize }

// CA returns the issuing CA certificate.
func (c *Credentials) CA() *x509.Certificate { return c.ca }

// Bundle returns the PEM bundle returned to workers as `ca`.
func (c *Credentials) Bundle() []byte { return c.bundle }

// Pool returns the bundle as a certificate pool.
func (c *Credentials) Pool() *x509.CertPool { return c.pool }

// mismatch reports an os-ca.crt that is not the signer's key's, naming
// both keys by fingerprint prefix.
func mismatch(ca *x509.Certificate, pub crypto.PublicKey) error {
	want, err := signer.Fingerprint(pub)
	if err != nil {
		return err
	}
	got, err := signer.Fingerprint(ca.PublicKey)
	if err != nil {
		return err
	}
	return fmt.Errorf("OS CA certificate does not match the signer's key (certificate key %s, signer key %s)", got[:16], want[:16])
}
