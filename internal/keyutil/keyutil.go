// Package keyutil is the software key codec of steward-trustd: it
// generates keys of a signer.Algorithm and reads and writes private keys
// as PEM. The file backend, keystore (client keys, imported CAs) and the
// tests use it; it opens no device and imports no backend, so every
// layer may depend on it (as smallstep's keyutil/pemutil serve its KMS
// backends, never the reverse).
package keyutil

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/steward-trustd/steward-trustd/signer"
)

// MinRSABits is the smallest RSA modulus accepted for a CA key.
const MinRSABits = 2048

// GenerateKey creates a software key of the given algorithm.
func GenerateKey(r io.Reader, alg signer.Algorithm) (crypto.Signer, error) {
	switch alg {
	case signer.ECDSAP256:
		return ecdsa.GenerateKey(elliptic.P256(), r)
	case signer.ECDSAP384:
		return ecdsa.GenerateKey(elliptic.P384(), r)
	case signer.RSA2048:
		return rsa.GenerateKey(r, 2048)
	case signer.RSA3072:
		return rsa.GenerateKey(r, 3072)
	case signer.RSA4096:
		return rsa.GenerateKey(r, 4096)
	case signer.Ed25519:
		_, k, err := ed25519.GenerateKey(r)
		return k, err
	}
	return nil, fmt.Errorf("%w: %q", signer.ErrUnsupportedAlgorithm, alg)
}

// MarshalPrivateKeyPEM encodes key as a PKCS#8 (RFC 5208) "PRIVATE KEY"
// PEM block (RFC 7468 §10).
func MarshalPrivateKeyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParsePrivateKeyPEM parses the first private key PEM block in data:
// PKCS#8 ("PRIVATE KEY", and Talos's "ED25519 PRIVATE KEY"), SEC1
// ("EC PRIVATE KEY", RFC 5915) or PKCS#1 ("RSA PRIVATE KEY", RFC 8017).
// Encrypted PEM is refused, and so is an RSA key under MinRSABits.
func ParsePrivateKeyPEM(data []byte) (crypto.Signer, error) {
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return nil, errors.New("no private key PEM block found")
		}
		if !strings.HasSuffix(block.Type, "PRIVATE KEY") {
			continue
		}
		if _, enc := block.Headers["DEK-Info"]; enc || block.Type == "ENCRYPTED PRIVATE KEY" {
			return nil, errors.New("encrypted private keys are not supported; decrypt it first (openssl pkey)")
		}
		return parseDER(block.Type, block.Bytes)
	}
}

func parseDER(typ string, der []byte) (crypto.Signer, error) {
	var key any
	var err error
	switch typ {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(der)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(der)
	default:
		key, err = x509.ParsePKCS8PrivateKey(der)
	}
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", typ, err)
	}
	return caKey(key)
}

// caKey accepts the key types a CA may have.
func caKey(key any) (crypto.Signer, error) {
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		return k, nil
	case *rsa.PrivateKey:
		if k.N.BitLen() < MinRSABits {
			return nil, fmt.Errorf("RSA key of %d bits is too weak for a CA (need %d or more)", k.N.BitLen(), MinRSABits)
		}
		return k, nil
	case ed25519.PrivateKey:
		return k, nil
	}
	return nil, fmt.Errorf("unsupported private key type %T", key)
}
