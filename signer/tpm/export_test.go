package tpm

import (
	"context"
	"crypto"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// KeyHandle exposes the loaded key's handle and name to the external tests
// (which cannot be in package tpm: they import tpmsim, which imports tpm).
func KeyHandle(s *Signer) (tpm2.TPMHandle, tpm2.TPM2BName) {
	var key tpm2.TPMHandle
	_ = s.do(context.Background(), false, func(_ transport.TPM, at laneState) error {
		key = at.key
		return nil
	})
	return key, s.name
}

// uncheck decodes an approval without any software check.
func uncheck(a *tpmpolicy.Approval) (*tpmpolicy.CheckedApproval, error) {
	pol, err := hex.DecodeString(a.Pol)
	if err != nil {
		return nil, err
	}
	raw, err := base64.StdEncoding.DecodeString(a.Sig)
	if err != nil {
		return nil, err
	}
	sig, err := tpm2.Unmarshal[tpm2.TPMTSignature](raw)
	if err != nil {
		return nil, err
	}
	return &tpmpolicy.CheckedApproval{File: "unchecked.json", PCRs: a.PCRs, Pol: pol, Ref: a.Ref, Sig: *sig, Epoch: a.Epoch}, nil
}

// TPMVerifyApproval has the TPM verify approval a's signature as the
// signer does before PolicyAuthorize, skipping the software check that
// normally drops a forged approval first: it shows that the TPM itself
// refuses a signature by any key but the authority.
func TPMVerifyApproval(s *Signer, a *tpmpolicy.Approval) error {
	c, err := uncheck(a)
	if err != nil {
		return err
	}
	return s.do(context.Background(), false, func(t transport.TPM, _ laneState) error {
		_, err := s.ticket(t, c)
		return err
	})
}

// TPMSignWithApproval signs digest (SHA-256) with the key in the TPM
// after satisfying its policy with approval a as it stands — its own
// pcrs, pol, ref and signature, by the key's first authority — with every
// software check skipped: what root on the node could make the TPM do. It
// shows what the TPM itself accepts.
func TPMSignWithApproval(s *Signer, a *tpmpolicy.Approval, digest []byte) error {
	return TPMSignWithEpochClaim(s, a, a.Epoch, false, digest)
}

// TPMSignWithEpochClaim is TPMSignWithApproval for a revocable key where
// root on the node lies about the approval's epoch (PolicyNV with epoch
// instead of the signed one) or skips PolicyNV altogether (skipNV).
func TPMSignWithEpochClaim(s *Signer, a *tpmpolicy.Approval, epoch uint64, skipNV bool, digest []byte) error {
	c, err := uncheck(a)
	if err != nil {
		return err
	}
	c.Epoch = epoch
	return s.do(context.Background(), false, func(t transport.TPM, at laneState) error {
		sess, closeSess, err := tpm2.PolicySession(t, tpm2.TPMAlgSHA256, 16)
		if err != nil {
			return err
		}
		defer func() { _ = closeSess() }()
		if _, err := policyPCRDigest(t, sess.Handle(), c.PCRs); err != nil {
			return err
		}
		if !skipNV {
			if err := s.policyEpoch(t, sess.Handle(), c); err != nil {
				return err
			}
		}
		if err := s.authorizeWith(t, sess.Handle(), c, false); err != nil {
			return err
		}
		_, err = tpm2.Sign{
			KeyHandle:  tpm2.AuthHandle{Handle: at.key, Name: s.name, Auth: sess},
			Digest:     tpm2.TPM2BDigest{Buffer: digest},
			InScheme:   tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgECDSA, Details: tpm2.NewTPMUSigScheme(tpm2.TPMAlgECDSA, &tpm2.TPMSSchemeHash{HashAlg: tpm2.TPMAlgSHA256})},
			Validation: tpm2.TPMTTKHashCheck{Tag: tpm2.TPMSTHashCheck, Hierarchy: tpm2.TPMRHNull},
		}.Execute(t)
		return err
	})
}

// UncheckedApproval signs an approval of the sha256 PCR state pcrs =
// values with ref, with none of SignApproval's checks: the approval a
// careless or old tool could make (a resettable PCR, another selection or
// ref than the key's).
func UncheckedApproval(authority crypto.Signer, ref string, pcrs []int, values [][]byte) (*tpmpolicy.Approval, error) {
	if len(pcrs) != len(values) {
		return nil, errors.New("one value per PCR")
	}
	pc, err := tpm2.NewPolicyCalculator(tpm2.TPMAlgSHA256)
	if err != nil {
		return nil, err
	}
	if err := (tpm2.PolicyPCR{PcrDigest: tpm2.TPM2BDigest{Buffer: tpmpolicy.PCRDigest(values)}, Pcrs: tpmpolicy.PCRSelection(pcrs)}).Update(pc); err != nil {
		return nil, err
	}
	pol := pc.Hash().Digest
	a, err := tpmpolicy.NewAuthority(authority.Public())
	if err != nil {
		return nil, err
	}
	sig, err := tpmpolicy.SignTPMT(authority, a, tpmpolicy.ApprovalDigest(pol, ref))
	if err != nil {
		return nil, err
	}
	return &tpmpolicy.Approval{PCRs: pcrs, PKFP: a.Fingerprint(), Pol: hex.EncodeToString(pol), Sig: base64.StdEncoding.EncodeToString(tpm2.Marshal(sig)), Ref: ref}, nil
}

// ExtendPCR extends sha256 PCR idx with SHA-256(data) over the signer's
// own connection (a swtpm serves one connection at a time).
func ExtendPCR(s *Signer, idx int, data []byte) error {
	sum := sha256.Sum256(data)
	return s.do(context.Background(), false, func(t transport.TPM, _ laneState) error {
		_, err := tpm2.PCRExtend{
			PCRHandle: tpm2.AuthHandle{Handle: tpm2.TPMHandle(idx), Auth: tpm2.PasswordAuth(nil)},
			Digests:   tpm2.TPMLDigestValues{Digests: []tpm2.TPMTHA{{HashAlg: tpm2.TPMAlgSHA256, Digest: sum[:]}}},
		}.Execute(t)
		return err
	})
}

// GenerateV1 creates a key as this backend did before the PCR selection
// was bound: a v1 key (policyRef tpmpolicy.PolicyRef), for the tests that existing
// keys keep working and what their policy lets through.
func GenerateV1(ctx context.Context, b *Backend, uri string) (signer.Signer, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	u.legacy = true
	return b.generate(ctx, u, signer.ECDSAP256)
}
