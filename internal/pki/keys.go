package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"strings"
)

// RSA key sizes a certificate request may have: below MinRSABits is
// breakable, above MaxRSABits makes verifying the request's signature
// slow enough to be a denial of service.
const (
	MinRSABits = 2048
	MaxRSABits = 8192
)

// CheckRequestKey checks the public key of a certificate we are asked to
// issue and names it for logs: ECDSA on P-256, P-384 or P-521, Ed25519,
// or RSA of at least minRSABits (never less than MinRSABits; 0 means
// MinRSABits) and at most MaxRSABits.
func CheckRequestKey(pub crypto.PublicKey, minRSABits int) (string, error) {
	minRSABits = max(minRSABits, MinRSABits)
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256(), elliptic.P384(), elliptic.P521():
			return "ECDSA-" + k.Curve.Params().Name, nil
		}
		return "", fmt.Errorf("unsupported ECDSA curve %s (want P-256, P-384 or P-521)", k.Curve.Params().Name)
	case ed25519.PublicKey:
		return "Ed25519", nil
	case *rsa.PublicKey:
		return checkRSA(k, minRSABits)
	}
	return "", fmt.Errorf("unsupported public key type %T (want ECDSA, Ed25519 or RSA)", pub)
}

func checkRSA(k *rsa.PublicKey, minBits int) (string, error) {
	bits := k.N.BitLen()
	if bits < minBits {
		return "", fmt.Errorf("RSA key of %d bits is too small (minimum %d)", bits, minBits)
	}
	if bits > MaxRSABits {
		return "", fmt.Errorf("RSA key of %d bits is too large (maximum %d)", bits, MaxRSABits)
	}
	return fmt.Sprintf("RSA-%d", bits), nil
}

// KeyMatchesCert reports whether pub is the certificate's public key.
func KeyMatchesCert(pub crypto.PublicKey, c *x509.Certificate) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := pub.(equaler)
	return ok && e.Equal(c.PublicKey)
}

// CertFingerprint is the lowercase hex SHA-256 of the certificate's DER.
func CertFingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

// ParseFingerprint reads a hex SHA-256 fingerprint as people copy them
// (colons allowed, any case) and returns it as CertFingerprint prints it;
// anything but 64 hex digits is refused.
func ParseFingerprint(s string) (string, error) {
	h := strings.ToLower(strings.ReplaceAll(s, ":", ""))
	if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("%q is not a SHA-256 fingerprint (64 hex digits)", s)
	}
	return h, nil
}

// SubjectKeyID is the key identifier of pub in the manner of RFC 7093
// section 2 (the leftmost 160 bits of a SHA-256), computed over the DER
// SubjectPublicKeyInfo.
func SubjectKeyID(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("marshal public key: %w", err)
	}
	sum := sha256.Sum256(der)
	return sum[:20], nil
}

// AllowsClientAuth reports whether c may be in the chain of a client
// certificate, as Go's crypto/x509 (and so apid) decides: no ExtKeyUsage
// at all, or one listing ClientAuth or Any. A list holding only unknown
// usages allows nothing.
func AllowsClientAuth(c *x509.Certificate) bool {
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

// CheckClientCA checks that c can be in the `ca` bundle trustd returns,
// which apid uses as its client-CA pool: a CA that allows ClientAuth.
func CheckClientCA(c *x509.Certificate) error {
	if !c.IsCA || !c.BasicConstraintsValid {
		return fmt.Errorf("certificate %q is not a CA", c.Subject)
	}
	if !AllowsClientAuth(c) {
		return fmt.Errorf("CA %q has an ExtKeyUsage without ClientAuth; talosctl certificates under it would be refused by apid", c.Subject)
	}
	return nil
}
