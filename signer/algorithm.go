package signer

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"fmt"
)

// AlgorithmOf returns the Algorithm of pub: the one a backend would be
// asked to Generate to get a key like it. A key of no Algorithm (P-521,
// RSA-1024) is ErrUnsupportedAlgorithm. It compares key parameters, not
// names, so a backend's spelling of Description.Algorithm cannot make
// two algorithms look alike.
func AlgorithmOf(pub crypto.PublicKey) (Algorithm, error) {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return ecdsaAlgorithm(k.Curve)
	case *rsa.PublicKey:
		return rsaAlgorithm(k.N.BitLen())
	case ed25519.PublicKey:
		return Ed25519, nil
	}
	return "", fmt.Errorf("%w: %s", ErrUnsupportedAlgorithm, AlgorithmName(pub))
}

func ecdsaAlgorithm(c elliptic.Curve) (Algorithm, error) {
	switch c {
	case elliptic.P256():
		return ECDSAP256, nil
	case elliptic.P384():
		return ECDSAP384, nil
	}
	return "", fmt.Errorf("%w: ECDSA-%s", ErrUnsupportedAlgorithm, curveName(c))
}

func rsaAlgorithm(bits int) (Algorithm, error) {
	switch bits {
	case 2048:
		return RSA2048, nil
	case 3072:
		return RSA3072, nil
	case 4096:
		return RSA4096, nil
	}
	return "", fmt.Errorf("%w: RSA-%d", ErrUnsupportedAlgorithm, bits)
}
