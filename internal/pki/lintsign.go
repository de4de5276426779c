package pki

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/steward-trustd/steward-trustd/internal/certlint"
)

// ErrLintTBSMismatch reports a signed certificate whose to-be-signed bytes
// differ from the ones that were linted; it is never returned to a caller
// as a certificate.
var ErrLintTBSMismatch = errors.New("signed certificate differs from the linted one")

// lintThenSign is the only way a CA key signs a certificate here:
// x509.CreateCertificate encodes the complete certificate and hands its
// to-be-signed bytes to a lintingSigner, which lints them
// (internal/certlint) and returns a *certlint.Error before the device is
// asked; only then does the CA key sign exactly those bytes, and x509
// checks the new signature against the CA key, catching a faulty device.
// The result is checked as Boulder does: its TBS must equal the linted
// one (RFC 5280 §4.1). It returns the DER certificate and the names of
// the lints that warned.
//
// Linting inside the signing call (crypto.MessageSigner) costs no
// signature of its own: the earlier design signed a copy with a throwaway
// key, which x509 then verified, two ECDSA operations per certificate on
// top of the three a certificate needs (CSR check, signature, x509's check).
func lintThenSign(is issuance) ([]byte, []string, error) {
	ls := &lintingSigner{is: is}
	parent := is.ca
	if parent == nil {
		parent = is.tmpl
	}
	der, err := x509.CreateCertificate(is.rand, is.tmpl, parent, is.pub, ls)
	switch {
	case ls.lintErr != nil:
		return nil, nil, ls.lintErr
	case err != nil && ls.signed:
		return nil, nil, fmt.Errorf("sign certificate: the signing device returned a signature that does not verify: %w", err)
	case err != nil:
		return nil, nil, fmt.Errorf("sign certificate: %w", err)
	}
	if !bytes.Equal(tbsOf(der), ls.linted) {
		return nil, nil, ErrLintTBSMismatch
	}
	return der, ls.warnings, nil
}

// lintingSigner is the CA key as x509.CreateCertificate sees it: given
// the to-be-signed bytes (crypto.MessageSigner), it lints them and signs
// them with the CA key only if no lint refuses.
type lintingSigner struct {
	is       issuance
	linted   []byte // the TBS as linted and signed
	warnings []string
	lintErr  error // a lint refused, or the lint could not run
	signed   bool  // the CA key returned a signature
}

// Public is the CA key's: x509 picks the signature algorithm by it and
// verifies the new signature with it.
func (l *lintingSigner) Public() crypto.PublicKey { return l.is.key.Public() }

// Sign is never called: x509 signs through SignMessage.
func (l *lintingSigner) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) {
	return nil, errors.New("sign certificate: the lint step needs the message, not a digest")
}

// SignMessage lints tbs, then has the CA key sign it with the digest x509
// chose (Ed25519 signs the message itself, RFC 8410).
func (l *lintingSigner) SignMessage(r io.Reader, tbs []byte, opts crypto.SignerOpts) ([]byte, error) {
	if err := l.lint(tbs); err != nil {
		l.lintErr = err
		return nil, err
	}
	msg := tbs
	if h := opts.HashFunc(); h != 0 {
		d := h.New()
		d.Write(tbs)
		msg = d.Sum(nil)
	}
	sig, err := l.is.key.Sign(r, msg, opts)
	if err != nil {
		return nil, fmt.Errorf("sign certificate: %w", err)
	}
	l.signed = true
	return sig, nil
}

// lint checks the certificate made of tbs and a placeholder signature.
func (l *lintingSigner) lint(tbs []byte) error {
	der, err := certificateOf(tbs, placeholderSignature(l.is.key.Public()))
	if err != nil {
		return err
	}
	res, err := certlint.Check(der, l.is.kind, l.is.ca)
	if err != nil {
		return err
	}
	if err := res.Err(l.is.kind); err != nil {
		return err
	}
	l.linted, l.warnings = slices.Clone(tbs), res.WarningNames()
	return nil
}

// placeholderSignature stands in for the CA key's signature in the copy
// that is linted, well-formed for the key's algorithm and never verified:
// an ECDSA-Sig-Value (1, 1) (RFC 3279 §2.2.3), a zero Ed25519 signature
// (RFC 8032), a zero RSA block of the modulus' size (RFC 8017).
func placeholderSignature(pub crypto.PublicKey) []byte {
	switch k := pub.(type) {
	case ed25519.PublicKey:
		return make([]byte, ed25519.SignatureSize)
	case *rsa.PublicKey:
		return make([]byte, k.Size())
	}
	return []byte{0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x01}
}

// certificateOf assembles tbs and sig into a certificate; the signature
// algorithm is the one the TBS names (RFC 5280 §4.1.1.2: they must match).
func certificateOf(tbs, sig []byte) ([]byte, error) {
	alg, err := tbsSignatureAlgorithm(tbs)
	if err != nil {
		return nil, err
	}
	return derTLV(0x30, slices.Concat(tbs, alg, derTLV(0x03, append([]byte{0}, sig...)))), nil
}

// tbsSignatureAlgorithm is the DER AlgorithmIdentifier in a TBS: the
// field after the optional [0] version and the serial number.
func tbsSignatureAlgorithm(tbs []byte) ([]byte, error) {
	var seq asn1.RawValue
	if _, err := asn1.Unmarshal(tbs, &seq); err != nil {
		return nil, fmt.Errorf("split certificate to lint: %w", err)
	}
	rest := seq.Bytes
	for {
		var f asn1.RawValue
		var err error
		if rest, err = asn1.Unmarshal(rest, &f); err != nil {
			return nil, fmt.Errorf("split certificate to lint: %w", err)
		}
		if f.Class == asn1.ClassUniversal && f.Tag == asn1.TagSequence {
			return f.FullBytes, nil
		}
	}
}

// tbsOf is the TBS of a DER certificate, nil if it does not parse.
func tbsOf(der []byte) []byte {
	var outer, tbs asn1.RawValue
	if rest, err := asn1.Unmarshal(der, &outer); err != nil || len(rest) > 0 {
		return nil
	}
	if _, err := asn1.Unmarshal(outer.Bytes, &tbs); err != nil {
		return nil
	}
	return tbs.FullBytes
}

// derTLV encodes one DER element with a definite length (X.690 §8.1.3).
func derTLV(tag byte, content []byte) []byte {
	n := len(content)
	var length []byte
	switch {
	case n < 0x80:
		length = []byte{byte(n)}
	case n < 0x100:
		length = []byte{0x81, byte(n)}
	case n < 0x10000:
		length = []byte{0x82, byte(n >> 8), byte(n)}
	default:
		length = []byte{0x83, byte(n >> 16), byte(n >> 8), byte(n)}
	}
	return slices.Concat([]byte{tag}, length, content)
}
