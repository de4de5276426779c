package tpm

import "github.com/google/go-tpm/tpm2"

// KeyHandle exposes the loaded key's handle and name to the external tests
// (which cannot be in package tpm: they import tpmsim, which imports tpm).
func KeyHandle(s *Signer) (tpm2.TPMHandle, tpm2.TPM2BName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.key, s.name
}
