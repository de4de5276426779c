package keystore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// RevokeOptions configures Revoke.
type RevokeOptions struct {
	// SignerURI is the revocable TPM key (tpm:...;approvals=DIR) whose
	// approvals are withdrawn.
	SignerURI string
	// Before is the first epoch that stays valid: every approval written
	// at an epoch below it stops satisfying the key, at the TPM.
	Before uint64
}

// revocable is what a signer of a revocable key offers (*tpm.Signer).
type revocable interface {
	RevocationEpoch(ctx context.Context) (uint64, error)
	Revoke(ctx context.Context, before uint64, progress func(uint64)) (from, to uint64, err error)
}

// Revoke advances the revocation counter of a revocable TPM key to
// o.Before and records it in a receipt in receipts. The counter is its
// own resume state: every step is one atomic TPM2_NV_Increment and the
// counter never goes back, so a run interrupted anywhere (before, during
// or after the increments, before the receipt) is completed by running
// it again, which advances only what is left and writes the receipt.
// Nothing about any approval file changes: the TPM refuses the old ones.
func (c *Ceremony) Revoke(ctx context.Context, receipts Dir, o RevokeOptions) (_ *Outcome, err error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	s, err := c.Keys.Open(ctx, o.SignerURI)
	if err != nil {
		return nil, fmt.Errorf("policy revoke: open the key: %w", err)
	}
	defer closeKey(s, &err)
	r, ok := s.(revocable)
	if !ok {
		return nil, errors.New("policy revoke: the key is not a TPM key; only a revocable TPM key (created with --revocable) has a revocation counter")
	}
	from, to, err := r.Revoke(ctx, o.Before, func(uint64) { c.step("policy revoke: counter advanced") })
	if err != nil {
		return nil, fmt.Errorf("policy revoke: %w", err)
	}
	rec := newReceipt(opPolicyRevoke, s.Describe())
	rec.Details = map[string]string{"before": strconv.FormatUint(o.Before, 10), "from": strconv.FormatUint(from, 10), "epoch": strconv.FormatUint(to, 10)}
	res, err := c.record(receipts, &plan{receipt: rec})
	if err != nil {
		return nil, fmt.Errorf("policy revoke: %w", err)
	}
	res.Notes = revokeNotes(o.Before, from, to)
	return res, nil
}

// revokeNotes tells the operator what the counter did and what to do next.
func revokeNotes(before, from, to uint64) []string {
	done := fmt.Sprintf("revocation counter advanced from %d to %d: approvals written at an epoch below %d no longer unlock the key (the TPM refuses them)", from, to, before)
	if from >= before {
		done = fmt.Sprintf("revocation counter already at %d (at least %d): nothing to advance; approvals below epoch %d are refused", from, before, before)
	}
	return []string{done, fmt.Sprintf("approve the states that stay legitimate at the current epoch: steward-trustd-ceremony policy approve --authority AUTH --key KEY.tpmkey --epoch %d ...", to)}
}
