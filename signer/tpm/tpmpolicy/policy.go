package tpmpolicy

import (
	"crypto"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"

	"github.com/google/go-tpm/tpm2"
)

// authorizedBranch is the policy digest of one authority's branch:
// PolicyAuthorize(authority name, ref) then PolicyCommandCode(Sign).
// PolicyAuthorize replaces the session digest by one derived from the
// authority's name and ref alone (TPM 2.0 Part 3 §23.16), so whatever PCR
// state the authority approved, the key's own trailing PolicyCommandCode
// keeps it sign-only: an approval of PolicyCommandCode(Duplicate) still
// cannot pass the Sign restriction.
func authorizedBranch(a *Authority, ref string) ([]byte, error) {
	pc, err := tpm2.NewPolicyCalculator(tpm2.TPMAlgSHA256)
	if err != nil {
		return nil, err
	}
	if err := (tpm2.PolicyAuthorize{KeySign: a.name, PolicyRef: tpm2.TPM2BDigest{Buffer: []byte(ref)}}).Update(pc); err != nil {
		return nil, fmt.Errorf("compute policy: %w", err)
	}
	if err := (tpm2.PolicyCommandCode{Code: tpm2.TPMCCSign}).Update(pc); err != nil {
		return nil, fmt.Errorf("compute policy: %w", err)
	}
	return pc.Hash().Digest, nil
}

// authorizedPolicy is the authPolicy of a v1 key under auths (policyRef
// PolicyRef): what SignedPolicyDigest reports.
func authorizedPolicy(auths []*Authority) (policy []byte, branches [][]byte, err error) {
	return AuthorizedPolicy(auths, PolicyRef)
}

// AuthorizedPolicy is the authPolicy of a key under auths whose
// PolicyAuthorize names ref: the single branch, or PolicyOR of the
// branches (Part 3 §23.6) for two or more. It also returns the branch
// digests, which the session's PolicyOR needs.
func AuthorizedPolicy(auths []*Authority, ref string) (policy []byte, branches [][]byte, err error) {
	if len(auths) == 0 || len(auths) > MaxAuthorities {
		return nil, nil, fmt.Errorf("a key policy takes 1 to %d authorities, not %d", MaxAuthorities, len(auths))
	}
	for _, a := range auths {
		b, err := authorizedBranch(a, ref)
		if err != nil {
			return nil, nil, err
		}
		branches = append(branches, b)
	}
	if len(branches) == 1 {
		return branches[0], branches, nil
	}
	pc, err := tpm2.NewPolicyCalculator(tpm2.TPMAlgSHA256)
	if err != nil {
		return nil, nil, err
	}
	if err := (tpm2.PolicyOr{PHashList: DigestList(branches)}).Update(pc); err != nil {
		return nil, nil, fmt.Errorf("compute policy: %w", err)
	}
	return pc.Hash().Digest, branches, nil
}

// SignedPolicyDigestFor is the authPolicy of a key created under the
// policy authorities pubs with binding b (BindingForPCRs of its PCR
// selection for a key made today): what a verifier expects of an attested
// key under signed policies.
func SignedPolicyDigestFor(pubs []crypto.PublicKey, b Binding) ([]byte, error) {
	if b.mode == modeInvalid {
		return nil, errors.New("signed policy digest: no key binding")
	}
	auths, err := NewAuthorities(pubs)
	if err != nil {
		return nil, err
	}
	pol, _, err := AuthorizedPolicy(auths, b.ref)
	return pol, err
}

// NewAuthorities turns policy-authority public keys into Authorities, in order.
func NewAuthorities(pubs []crypto.PublicKey) ([]*Authority, error) {
	auths := make([]*Authority, 0, len(pubs))
	for _, p := range pubs {
		a, err := NewAuthority(p)
		if err != nil {
			return nil, err
		}
		auths = append(auths, a)
	}
	return auths, nil
}

func DigestList(ds [][]byte) tpm2.TPMLDigest {
	l := tpm2.TPMLDigest{}
	for _, d := range ds {
		l.Digests = append(l.Digests, tpm2.TPM2BDigest{Buffer: d})
	}
	return l
}

// PCRPolicyDigest is the digest of a fresh SHA-256 policy session after
// PolicyPCR(sha256:pcrs) with the PCRs holding values (one 32-byte value
// per PCR, in ascending PCR order): the "pol" an approval signs.
func PCRPolicyDigest(pcrs []int, values [][]byte) ([]byte, error) {
	// The one rule of ParsePCRs: a selection an approval may name, and
	// no negative index reaching PCRSelection (which would panic).
	if sel, err := ParsePCRs(PCRList(pcrs)); err != nil || len(pcrs) == 0 || !slices.Equal(sel, pcrs) {
		return nil, fmt.Errorf("PCR policy: PCRs %v: want distinct ascending sha256 PCRs 0-%d", pcrs, MaxPCR)
	}
	if len(pcrs) != len(values) {
		return nil, errors.New("PCR policy: one value per PCR is needed")
	}
	for _, v := range values {
		if len(v) != sha256.Size {
			return nil, fmt.Errorf("PCR policy: a sha256 PCR value is %d bytes, not %d", sha256.Size, len(v))
		}
	}
	pc, err := tpm2.NewPolicyCalculator(tpm2.TPMAlgSHA256)
	if err != nil {
		return nil, err
	}
	if err := (tpm2.PolicyPCR{PcrDigest: tpm2.TPM2BDigest{Buffer: PCRDigest(values)}, Pcrs: PCRSelection(pcrs)}).Update(pc); err != nil {
		return nil, fmt.Errorf("compute PCR policy: %w", err)
	}
	return pc.Hash().Digest, nil
}

// ApprovalDigest is what an authority signs: SHA-256(pol || ref), the
// aHash that TPM2_PolicyAuthorize checks the ticket against (Part 3
// §23.16, with the authority's nameAlg SHA-256).
func ApprovalDigest(pol []byte, ref string) []byte {
	h := sha256.New()
	h.Write(pol)
	h.Write([]byte(ref))
	return h.Sum(nil)
}

// SignedPolicyDigest is the authPolicy of a v1 key (policyRef without the
// PCR selection) created under the policy authorities pubs: what a
// verifier expected of keys made before the selection was bound.
// SignedPolicyDigestFor gives the digest of a key made today.
func SignedPolicyDigest(pubs []crypto.PublicKey) ([]byte, error) {
	auths, err := NewAuthorities(pubs)
	if err != nil {
		return nil, err
	}
	pol, _, err := authorizedPolicy(auths)
	return pol, err
}
