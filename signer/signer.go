// Package signer defines the CA key abstraction of steward-trustd: a
// crypto.Signer whose private half may live in a TPM, a PKCS#11 token or, on
// explicit request only, a file. Backends are opened from a key URI whose
// scheme selects the backend (see Registry).
package signer

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
)

// Signer is a CA private key held by a backend. Public never fails: backends
// read the public key once when the key is opened.
type Signer interface {
	crypto.Signer
	// Describe reports what the key is and where it lives.
	Describe() Description
	// Close releases the device handles and sessions held by the signer.
	Close() error
}

// Description is what an operator needs to know about a key without
// touching its private half.
type Description struct {
	// Backend is the key URI scheme that opened the key: "file", "tpm", "pkcs11".
	Backend string `json:"backend"`
	// Algorithm is the key algorithm, e.g. "ECDSA-P256", "Ed25519", "RSA-3072".
	Algorithm string `json:"algorithm"`
	// Fingerprint is the lowercase hex SHA-256 of the DER SubjectPublicKeyInfo.
	Fingerprint string `json:"fingerprint"`
	// Extractable is true when the private key can leave the backend
	// (always true for a file key).
	Extractable bool `json:"extractable"`
	// Policy describes the use policy bound to the key, if any
	// (e.g. "pcr sha256:7,11 + CC_Sign" for a TPM key).
	Policy string `json:"policy,omitempty"`
	// PolicyDigest is the hex digest of that policy as the device computes
	// it (a TPM authPolicy), if any.
	PolicyDigest string `json:"policyDigest,omitempty"`
	// Location is where the key lives, without any secret
	// (a path, a persistent handle, a token label and object id).
	Location string `json:"location,omitempty"`
}

// Errors every backend wraps so that callers can classify a failure with
// errors.Is without knowing the backend. Backends keep the device's own
// typed error (TPM response code, PKCS#11 return value) in the same chain,
// e.g. fmt.Errorf("tpm sign: %w: %w", signer.ErrPolicyNotSatisfied, rc).
var (
	// ErrInvalidOptions reports SignerOpts the key cannot honour (wrong hash,
	// wrong digest length). Nothing was sent to the device.
	ErrInvalidOptions = errors.New("invalid signer options")
	// ErrPolicyNotSatisfied reports that the device refused to use the key
	// because its use policy (e.g. a TPM PCR policy) is not met.
	ErrPolicyNotSatisfied = errors.New("key use policy not satisfied")
	// ErrDeviceUnavailable reports that the device cannot be reached or lost
	// its session; the backend reconnects by itself.
	ErrDeviceUnavailable = errors.New("signing device unavailable")
	// ErrAuthentication reports a wrong or unreadable PIN or password.
	ErrAuthentication = errors.New("signing device authentication failed")
	// ErrKeyNotFound reports that the key URI names no existing key.
	ErrKeyNotFound = errors.New("key not found")
	// ErrKeyExists reports that a key was to be created where one exists.
	ErrKeyExists = errors.New("key already exists")
	// ErrUnsupportedAlgorithm reports an algorithm the backend cannot hold.
	ErrUnsupportedAlgorithm = errors.New("unsupported key algorithm")
	// ErrInvalidURI reports a key URI that does not parse.
	ErrInvalidURI = errors.New("invalid key URI")
)

// ErrorKind names the class of a signer error for logs and metrics:
// "options", "policy", "device", "auth", "not_found", "exists",
// "algorithm", "uri" or "other".
func ErrorKind(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrInvalidOptions):
		return "options"
	case errors.Is(err, ErrPolicyNotSatisfied):
		return "policy"
	case errors.Is(err, ErrDeviceUnavailable):
		return "device"
	case errors.Is(err, ErrAuthentication):
		return "auth"
	case errors.Is(err, ErrKeyNotFound):
		return "not_found"
	case errors.Is(err, ErrKeyExists):
		return "exists"
	case errors.Is(err, ErrUnsupportedAlgorithm):
		return "algorithm"
	case errors.Is(err, ErrInvalidURI):
		return "uri"
	default:
		return "other"
	}
}

// Algorithm is a key algorithm a backend can generate.
type Algorithm string

// Key algorithms. Not every backend holds every one: a TPM cannot hold Ed25519.
const (
	ECDSAP256 Algorithm = "p256"
	ECDSAP384 Algorithm = "p384"
	RSA2048   Algorithm = "rsa2048"
	RSA3072   Algorithm = "rsa3072"
	RSA4096   Algorithm = "rsa4096"
	Ed25519   Algorithm = "ed25519"
)

// ParseAlgorithm parses a command-line algorithm name.
func ParseAlgorithm(s string) (Algorithm, error) {
	switch a := Algorithm(s); a {
	case ECDSAP256, ECDSAP384, RSA2048, RSA3072, RSA4096, Ed25519:
		return a, nil
	}
	return "", fmt.Errorf("%w: %q (want p256, p384, rsa2048, rsa3072, rsa4096 or ed25519)", ErrUnsupportedAlgorithm, s)
}

// Backend opens and creates keys of one key URI scheme.
type Backend interface {
	// Scheme is the URI scheme this backend serves, without the colon.
	Scheme() string
	// Open opens an existing key. It fails with ErrKeyNotFound when the URI
	// names no key; it never creates one.
	Open(ctx context.Context, uri string) (Signer, error)
	// Generate creates a new key inside the backend at the place the URI
	// names. It fails with ErrKeyExists rather than replace a key.
	Generate(ctx context.Context, uri string, alg Algorithm) (Signer, error)
	// Import moves an existing private key into the backend as
	// non-extractable where the backend can enforce that, and verifies it
	// by signing. It fails with ErrKeyExists rather than replace a key.
	Import(ctx context.Context, uri string, key crypto.Signer) (Signer, error)
}

// Fingerprint returns the lowercase hex SHA-256 of pub's DER
// SubjectPublicKeyInfo.
func Fingerprint(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("marshal public key: %w", err)
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:]), nil
}

// AlgorithmName describes a public key as "ECDSA-P256", "RSA-3072" or "Ed25519".
func AlgorithmName(pub crypto.PublicKey) string {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return "ECDSA-" + curveName(k.Curve)
	case *rsa.PublicKey:
		return fmt.Sprintf("RSA-%d", k.N.BitLen())
	case ed25519.PublicKey:
		return "Ed25519"
	default:
		return fmt.Sprintf("%T", pub)
	}
}

func curveName(c elliptic.Curve) string {
	switch c {
	case elliptic.P256():
		return "P256"
	case elliptic.P384():
		return "P384"
	case elliptic.P521():
		return "P521"
	}
	return c.Params().Name
}

// CheckOpts validates opts for a signature by pub over digest before any
// device is touched, as crypto/x509 and crypto/tls expect of a Signer:
// ECDSA and RSA keys sign a digest of exactly opts.HashFunc().Size() bytes
// with SHA-256, SHA-384 or SHA-512; Ed25519 keys sign the whole message
// (opts.HashFunc() == 0, pure Ed25519 only). It returns an error wrapping
// ErrInvalidOptions.
func CheckOpts(pub crypto.PublicKey, digest []byte, opts crypto.SignerOpts) error {
	if opts == nil {
		return fmt.Errorf("%w: nil SignerOpts", ErrInvalidOptions)
	}
	h := opts.HashFunc()
	if _, ok := pub.(ed25519.PublicKey); ok {
		if h != crypto.Hash(0) {
			return fmt.Errorf("%w: Ed25519 signs the message itself, got hash %v", ErrInvalidOptions, h)
		}
		if o, ok := opts.(*ed25519.Options); ok && o.Context != "" {
			return fmt.Errorf("%w: Ed25519ctx is not supported", ErrInvalidOptions)
		}
		return nil
	}
	switch h {
	case crypto.SHA256, crypto.SHA384, crypto.SHA512:
	default:
		return fmt.Errorf("%w: unsupported hash %v", ErrInvalidOptions, h)
	}
	if len(digest) != h.Size() {
		return fmt.Errorf("%w: digest is %d bytes, %v needs %d", ErrInvalidOptions, len(digest), h, h.Size())
	}
	if _, pss := opts.(*rsa.PSSOptions); pss {
		if _, isRSA := pub.(*rsa.PublicKey); !isRSA {
			return fmt.Errorf("%w: PSS options for a non-RSA key", ErrInvalidOptions)
		}
	}
	return nil
}
