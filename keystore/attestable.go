package keystore

import "github.com/steward-trustd/steward-trustd/signer"

// AttestationReporter is implemented by signers whose key a TPM can
// attest (the TPM backend). Attestability says whether this key can be:
// created in the TPM with its creation evidence kept, or not and why.
type AttestationReporter interface {
	Attestability() (bool, string)
}

// attestability reports on s for status.
func attestability(s signer.Signer) (bool, string) {
	if ar, ok := s.(AttestationReporter); ok {
		return ar.Attestability()
	}
	switch d := s.Describe(); d.Backend {
	case "file":
		return false, "a file key is extractable; nothing can prove where its copies are"
	case "pkcs11":
		return false, "TPM attestation does not apply to an HSM key; use the HSM vendor's key attestation (e.g. YubiHSM 2 attested keys) and the CKA_* attributes status already checks"
	default:
		return false, "the " + d.Backend + " backend cannot attest its keys"
	}
}
