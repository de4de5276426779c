package pki

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"slices"

	"github.com/steward-trustd/steward-trustd/internal/certlint"
)

// ErrLintTBSMismatch reports a signed certificate whose to-be-signed bytes
// differ from the ones that were linted; it is never returned to a caller
// as a certificate.
var ErrLintTBSMismatch = errors.New("signed certificate differs from the linted one")

// lintThenSign is the only way a CA key signs a certificate here: the
// complete certificate is first signed by a throwaway key of the CA key's
// algorithm and linted (internal/certlint); a lint error returns a
// *certlint.Error before the device is asked. Then exactly the linted
// to-be-signed bytes are signed by the CA key and assembled into the
// certificate (RFC 5280 §4.1), and the result is checked as Boulder does:
// its TBS must equal the linted one and the signature must verify. It
// returns the DER certificate and the names of the lints that warned.
func lintThenSign(is issuance) ([]byte, []string, error) {
	linted, res, err := lintCopy(is)
	if err != nil {
		return nil, nil, err
	}
	if err := res.Err(is.kind); err != nil {
		return nil, nil, err
	}
	sig, err := signTBS(is, linted)
	if err != nil {
		return nil, nil, err
	}
	der, err := assemble(linted, sig)
	if err != nil {
		return nil, nil, err
	}
	return der, res.WarningNames(), nil
}

// lintCopy builds the certificate signed by a throwaway key and lints it.
// The parent is the issuer with the throwaway public key (x509 refuses a
// signer that is not the parent's key); names, key identifiers and the
// signature algorithm are unchanged, so the TBS is the real one.
func lintCopy(is issuance) (*x509.Certificate, certlint.Result, error) {
	throwaway, err := certlint.ThrowawayKey(is.key.Public())
	if err != nil {
		return nil, certlint.Result{}, err
	}
	parent := is.tmpl
	if is.ca != nil {
		p := *is.ca
		p.PublicKey = throwaway.Public()
		parent = &p
	}
	der, err := x509.CreateCertificate(rand.Reader, is.tmpl, parent, is.pub, throwaway)
	if err != nil {
		return nil, certlint.Result{}, fmt.Errorf("build certificate to lint: %w", err)
	}
	res, err := certlint.Check(der, is.kind, is.ca)
	if err != nil {
		return nil, certlint.Result{}, err
	}
	return res.Linted, res, nil
}

// signTBS has the CA key sign the linted TBS with the digest its
// signature algorithm names (Ed25519 signs the message itself, RFC 8410)
// and checks the signature against the CA key, catching a faulty device.
func signTBS(is issuance, linted *x509.Certificate) ([]byte, error) {
	h, err := tbsHash(linted.SignatureAlgorithm)
	if err != nil {
		return nil, err
	}
	msg := linted.RawTBSCertificate
	if h != 0 {
		d := h.New()
		d.Write(msg)
		msg = d.Sum(nil)
	}
	sig, err := is.key.Sign(is.rand, msg, h)
	if err != nil {
		return nil, fmt.Errorf("sign certificate: %w", err)
	}
	check := &x509.Certificate{PublicKey: is.key.Public()}
	if err := check.CheckSignature(linted.SignatureAlgorithm, linted.RawTBSCertificate, sig); err != nil {
		return nil, fmt.Errorf("sign certificate: the signing device returned a signature that does not verify: %w", err)
	}
	return sig, nil
}

// tbsHash is the digest x509 uses for the signature algorithm it picks
// for a CA key (crypto/x509 signingParamsForKey).
func tbsHash(alg x509.SignatureAlgorithm) (crypto.Hash, error) {
	switch alg {
	case x509.PureEd25519:
		return 0, nil
	case x509.SHA256WithRSA, x509.ECDSAWithSHA256:
		return crypto.SHA256, nil
	case x509.SHA384WithRSA, x509.ECDSAWithSHA384:
		return crypto.SHA384, nil
	case x509.SHA512WithRSA, x509.ECDSAWithSHA512:
		return crypto.SHA512, nil
	}
	return 0, fmt.Errorf("sign certificate: unsupported signature algorithm %s", alg)
}

// assemble puts the CA key's signature on the linted TBS, as RFC 5280
// §4.1's Certificate: SEQUENCE { tbsCertificate, signatureAlgorithm,
// signatureValue BIT STRING }. The TBS and algorithm are copied from the
// linted certificate, never re-encoded; afterwards the certificate's TBS
// is checked to be byte for byte the linted one.
func assemble(linted *x509.Certificate, sig []byte) ([]byte, error) {
	var outer asn1.RawValue
	if _, err := asn1.Unmarshal(linted.Raw, &outer); err != nil {
		return nil, fmt.Errorf("split linted certificate: %w", err)
	}
	var tbs, alg asn1.RawValue
	rest, err := asn1.Unmarshal(outer.Bytes, &tbs)
	if err == nil {
		_, err = asn1.Unmarshal(rest, &alg)
	}
	if err != nil {
		return nil, fmt.Errorf("split linted certificate: %w", err)
	}
	bitString := derTLV(0x03, append([]byte{0}, sig...)) // no unused bits
	body := slices.Concat(tbs.FullBytes, alg.FullBytes, bitString)
	der := derTLV(0x30, body)
	if !bytes.Equal(tbsOf(der), linted.RawTBSCertificate) {
		return nil, ErrLintTBSMismatch
	}
	return der, nil
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
