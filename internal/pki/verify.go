package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
)

// VerifySignature checks sig over msg with pub the way the ceremony has a
// device sign: a SHA-256 digest for ECDSA (ASN.1) and RSA (PKCS #1 v1.5,
// RFC 8017 section 8.2), the message itself for Ed25519 (RFC 8032).
func VerifySignature(pub crypto.PublicKey, msg, sig []byte) error {
	sum := sha256.Sum256(msg)
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if !ecdsa.VerifyASN1(k, sum[:], sig) {
			return errors.New("ECDSA signature invalid")
		}
		return nil
	case *rsa.PublicKey:
		return rsa.VerifyPKCS1v15(k, crypto.SHA256, sum[:], sig)
	case ed25519.PublicKey:
		if !ed25519.Verify(k, msg, sig) {
			return errors.New("Ed25519 signature invalid")
		}
		return nil
	}
	return fmt.Errorf("unsupported public key type %T", pub)
}

// SignMessage has s sign msg the way VerifySignature checks it: SHA-256
// and the hash named for ECDSA and RSA, the message itself for Ed25519.
func SignMessage(s crypto.Signer, r io.Reader, msg []byte) ([]byte, error) {
	if _, ok := s.Public().(ed25519.PublicKey); ok {
		return s.Sign(r, msg, crypto.Hash(0))
	}
	sum := sha256.Sum256(msg)
	return s.Sign(r, sum[:], crypto.SHA256)
}
