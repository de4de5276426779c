package server

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io/fs"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// Credentials are the inputs that may change while the server runs: the
// worker token, the OS CA certificate, the issuer chain and the CA bundle
// returned to workers. Values are immutable once built; reload swaps the
// whole set.
type Credentials struct {
	tokens tokenSet
	ca     *x509.Certificate
	// chain is issuer.crt (tiered setup): the signing key's certificate
	// first; empty when os-ca.crt is the signing key's.
	chain    []*x509.Certificate
	chainPEM []byte
	bundle   []byte
	pool     *x509.CertPool
	// bundleSize is how many CAs bundle holds, for logs.
	bundleSize int
	// trust is how the root's statement decided the bundle.
	trust *certdir.Trust
	// tokenFileMode is the token file's permissions (0: inline token).
	tokenFileMode fs.FileMode
}

// CredentialFiles are the contents of the credential files; nil means
// absent (AcceptedCAs and IssuerChain are optional).
type CredentialFiles struct {
	// Token holds one or more worker tokens, one per line.
	Token []byte
	// CACert is os-ca.crt, the root returned to workers as `ca`.
	CACert []byte
	// AcceptedCAs adds CAs that may also authenticate talosctl.
	AcceptedCAs []byte
	// IssuerChain is issuer.crt, the signing key's chain up to (without)
	// a CA of CACert/AcceptedCAs.
	IssuerChain []byte
	// IssuerSource names where IssuerChain came from in messages; empty
	// means issuer.crt.
	IssuerSource string
	// TrustStatement is accepted-cas.statement.json, the root's signed
	// list of the accepted CAs it vouches for; nil means absent.
	TrustStatement []byte
}

// NewCredentials checks and assembles single-tier credentials: the
// issuing OS CA certificate caPEM must hold the signer's public key. See
// LoadCredentials.
func NewCredentials(token []byte, caPEM, acceptedPEM []byte, pub crypto.PublicKey) (*Credentials, error) {
	return LoadCredentials(CredentialFiles{Token: token, CACert: caPEM, AcceptedCAs: acceptedPEM}, pub, time.Now())
}

// LoadCredentials checks and assembles credentials. The bundle returned to
// workers (os-ca.crt, then the CAs of accepted-cas.crt the root's trust
// statement vouches for: certdir.ParseTrust) becomes apid's client-CA
// pool, so every block in it must be a CA certificate allowing ClientAuth;
// the accepted CAs left out are in Trust().Unvouched.
// Without an issuer chain os-ca.crt must hold the signer's key (pub; nil
// skips the check). With one, pki.CheckIssuerChain applies at now: the
// signer's key is the chain's first certificate, every certificate is a
// [ServerAuth]-only CA, and the chain verifies to the bundle.
func LoadCredentials(f CredentialFiles, pub crypto.PublicKey, now time.Time) (*Credentials, error) {
	tokens, err := parseTokens(f.Token)
	if err != nil {
		return nil, err
	}
	trust, err := certdir.ParseTrust(f.CACert, f.AcceptedCAs, f.TrustStatement)
	if err != nil {
		return nil, err
	}
	ca, cas := trust.CA, trust.Bundle
	c := &Credentials{tokens: tokens, ca: ca, bundle: pki.EncodeCertificates(cas...), pool: x509.NewCertPool(), bundleSize: len(cas), trust: trust}
	for _, b := range cas {
		c.pool.AddCert(b)
	}
	if f.IssuerChain == nil {
		if pub != nil && !pki.KeyMatchesCert(pub, ca) {
			return nil, mismatch(ca, pub)
		}
		return c, nil
	}
	if c.chain, err = pki.ParseCertificates(f.IssuerChain); err == nil {
		err = pki.CheckIssuerChain(c.chain, cas, pub, now)
	}
	if err != nil {
		if f.IssuerSource == "" {
			f.IssuerSource = certdir.FileIssuerChain
		}
		return nil, fmt.Errorf("issuer chain (%s): %w", f.IssuerSource, err)
	}
	c.chainPEM = pki.EncodeCertificates(c.chain...)
	return c, nil
}

// Tokens is the number of valid worker tokens.
func (c *Credentials) Tokens() int { return c.tokens.len() }

// BundleSize is the number of CAs in Bundle.
func (c *Credentials) BundleSize() int { return c.bundleSize }

// CA returns the OS CA certificate (os-ca.crt).
func (c *Credentials) CA() *x509.Certificate { return c.ca }

// Issuer returns the certificate of the signing key: the first of the
// issuer chain, or the OS CA when there is none.
func (c *Credentials) Issuer() *x509.Certificate {
	if len(c.chain) > 0 {
		return c.chain[0]
	}
	return c.ca
}

// Chain returns the issuer chain (nil in the single-tier setup): what
// follows every certificate the signer issues, so that verifiers reach
// the root.
func (c *Credentials) Chain() []*x509.Certificate { return c.chain }

// IssuerNotAfter is when the signer stops being able to issue anything
// that verifies: the earliest NotAfter of the issuer chain, or the OS
// CA's.
func (c *Credentials) IssuerNotAfter() time.Time {
	if len(c.chain) > 0 {
		return pki.IssuerNotAfter(c.chain)
	}
	return c.ca.NotAfter
}

// validity is the lifetime of a worker certificate issued at now: want,
// cut so that it ends no later than the issuer chain. pki.Validity clamps
// to the signing certificate alone; a chain whose higher CA expires first
// would otherwise hand out certificates that outlive it. An expired chain
// gives a lifetime ≤ 0, which issuance refuses.
func (c *Credentials) validity(want time.Duration, now time.Time) time.Duration {
	return min(want, c.IssuerNotAfter().Sub(now))
}

// Bundle returns the PEM bundle returned to workers as `ca`.
func (c *Credentials) Bundle() []byte { return c.bundle }

// Trust returns how the root's statement decided the bundle: the
// accepted CAs left out, the statement and why it was refused.
func (c *Credentials) Trust() *certdir.Trust { return c.trust }

// Pool returns the bundle as a certificate pool.
func (c *Credentials) Pool() *x509.CertPool { return c.pool }

// withChain returns the PEM of leaf followed by the issuer chain: a
// worker's apid serves the response's `crt` whole (tls.X509KeyPair keeps
// every block), so talosctl can build the path to the root.
func (c *Credentials) withChain(leafDER []byte) []byte {
	return append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}), c.chainPEM...)
}

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
	return fmt.Errorf("OS CA certificate does not match the signer's key (certificate key %s, signer key %s): after `rotate --finish` the cert dir holds the new CA, so restart the daemon with TRUSTD_SIGNER set to the new key (--new-signer; the signer changes only at a restart); otherwise put back the os-ca.crt of this key; in the tiered setup, provide the signer's chain as %s", got[:16], want[:16], certdir.FileIssuerChain)
}
