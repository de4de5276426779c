package tpm

import (
	"context"
	"encoding/base64"
	"encoding/hex"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
)

// KeyHandle exposes the loaded key's handle and name to the external tests
// (which cannot be in package tpm: they import tpmsim, which imports tpm).
func KeyHandle(s *Signer) (tpm2.TPMHandle, tpm2.TPM2BName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.key, s.name
}

// TPMVerifyApproval has the TPM verify approval a's signature as the
// signer does before PolicyAuthorize, skipping the software check that
// normally drops a forged approval first: it shows that the TPM itself
// refuses a signature by any key but the authority.
func TPMVerifyApproval(s *Signer, a *Approval) error {
	pol, err := hex.DecodeString(a.Pol)
	if err != nil {
		return err
	}
	raw, err := base64.StdEncoding.DecodeString(a.Sig)
	if err != nil {
		return err
	}
	sig, err := tpm2.Unmarshal[tpm2.TPMTSignature](raw)
	if err != nil {
		return err
	}
	c := &checkedApproval{file: "forged.json", pcrs: a.PCRs, pol: pol, sig: *sig}
	return s.do(context.Background(), false, func(t transport.TPM, _ tpm2.TPMHandle) error {
		_, err := s.ticket(t, c)
		return err
	})
}
