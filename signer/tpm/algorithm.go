package tpm

import (
	"fmt"

	"github.com/steward-trustd/steward-trustd/signer"
)

// UnsupportedKeyError is a key algorithm this backend cannot hold, with
// what to do instead. It wraps signer.ErrUnsupportedAlgorithm, so callers
// that only need the class test errors.Is; callers that show the user
// what to do print it whole.
type UnsupportedKeyError struct {
	// Algorithm is what was asked for.
	Algorithm signer.Algorithm
	// Reason says why the TPM cannot hold it; Hint what to use instead.
	Reason, Hint string
}

// Error implements error: the algorithm, why, and what to do instead.
func (e *UnsupportedKeyError) Error() string {
	return fmt.Sprintf("%v: tpm: %s: %s; %s", signer.ErrUnsupportedAlgorithm, e.Algorithm, e.Reason, e.Hint)
}

// Unwrap returns signer.ErrUnsupportedAlgorithm.
func (e *UnsupportedKeyError) Unwrap() error { return signer.ErrUnsupportedAlgorithm }

// errEd25519 refuses Ed25519: the TPM 2.0 library specification (Part 2,
// TPM_ALG_ID) defines no EdDSA for the TPMs in use.
func errEd25519() error {
	return &UnsupportedKeyError{
		Algorithm: signer.Ed25519,
		Reason:    "a TPM 2.0 cannot hold Ed25519 keys (no EdDSA in the TPM 2.0 library)",
		Hint: "use ECDSA P-256 or P-384 on the TPM (init --algorithm p256 works with every Talos version, because the " +
			"certificate signature follows the CA key; an existing Ed25519 CA moves to it with rotate), or keep " +
			"Ed25519 in a PKCS#11 HSM that supports CKM_EDDSA (a pkcs11: key URI) or in a file key (file:)",
	}
}

// errRSA refuses RSA: the backend's key template and policy are ECDSA's.
func errRSA(alg signer.Algorithm) error {
	return &UnsupportedKeyError{
		Algorithm: alg,
		Reason:    "the tpm backend holds ECDSA keys only",
		Hint:      "use --algorithm p256 or p384, or keep an RSA CA in a PKCS#11 HSM (a pkcs11: key URI)",
	}
}
