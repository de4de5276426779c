package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/big"
	"time"
)

// SerialNumber returns a positive serial of 128 random bits (RFC 5280
// section 4.1.2.2 allows up to 20 octets; CA/B Forum asks for 64+ bits).
func SerialNumber(r io.Reader) (*big.Int, error) {
	b := make([]byte, 16)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	b[0] |= 0x40 // keep 127+ significant bits, and positive
	b[0] &= 0x7f
	return new(big.Int).SetBytes(b), nil
}

// ErrIssuerExpired reports an issuer whose certificate has expired: it
// can issue nothing any verifier would accept.
var ErrIssuerExpired = errors.New("the issuing CA certificate has expired")

// Validity returns the NotBefore and NotAfter of a certificate issued at
// now for lifetime under issuer: NotBefore is backdated by Backdate (not
// before the issuer's NotBefore), and
// NotAfter is clamped to the issuer's NotAfter, because a leaf that
// outlives its CA stops verifying when the CA does (RFC 5280 section
// 6.1.3 checks every certificate of the path). A nil issuer (a
// self-signed CA) is not clamped. An issuer that has expired at now is
// ErrIssuerExpired.
func Validity(now time.Time, lifetime time.Duration, issuer *x509.Certificate) (notBefore, notAfter time.Time, err error) {
	if lifetime <= 0 {
		return time.Time{}, time.Time{}, fmt.Errorf("validity %v must be positive", lifetime)
	}
	notAfter = now.Add(lifetime)
	if issuer != nil && notAfter.After(issuer.NotAfter) {
		notAfter = issuer.NotAfter
	}
	if issuer != nil && !notAfter.After(now) {
		return time.Time{}, time.Time{}, fmt.Errorf("%w (not after %s)", ErrIssuerExpired, issuer.NotAfter.UTC().Format(time.RFC3339))
	}
	notBefore = now.Add(-Backdate)
	// Inside the issuer's validity, as the lint e_talos_validity_within_issuer demands.
	if issuer != nil && notBefore.Before(issuer.NotBefore) {
		notBefore = issuer.NotBefore
	}
	return notBefore, notAfter, nil
}
