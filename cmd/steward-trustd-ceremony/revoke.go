package main

// Revocable approvals: the --revocable flag of the commands
// that create a key, policy revoke, and the epoch policy approve signs.

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/google/go-tpm/tpm2"
	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// revocableFlags are --revocable and --revocation-index.
type revocableFlags struct {
	on    bool
	index string
}

func (r *revocableFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&r.on, "revocable", false, "TPM only, with --policy-authority: make the key's approvals revocable: an NV counter on the TPM (owner hierarchy) is checked by TPM2_PolicyNV inside every approval, and 'policy revoke' withdraws all approvals older than an epoch (see signer/tpm/README.md)")
	cmd.Flags().StringVar(&r.index, "revocation-index", "", fmt.Sprintf("with --revocable: the owner NV index of the revocation counter, 0x01000000-0x01bfffff (default 0x%08x)", uint32(tpmpolicy.DefaultRevocationIndex)))
}

// apply makes a tpm: key URI about to be created under authorities
// revocable (revocation=INDEX).
func (r *revocableFlags) apply(uri string, authorities []string, systemd bool) (string, error) {
	switch {
	case !r.on && r.index != "":
		return "", cli.Usagef("--revocation-index applies with --revocable")
	case !r.on:
		return uri, nil
	case len(authorities) == 0 || !tpm.IsKeyURI(uri):
		return "", cli.Usagef("--revocable applies to a tpm: key under a --policy-authority")
	case systemd:
		return "", cli.Usagef("--revocable and --systemd-compatible exclude each other: systemd-measure signs no revocation epoch")
	}
	idx := tpmpolicy.DefaultRevocationIndex
	if r.index != "" {
		n, err := strconv.ParseUint(strings.TrimPrefix(r.index, "0x"), 16, 32)
		if err != nil || !strings.HasPrefix(r.index, "0x") {
			return "", cli.Usagef("--revocation-index %q: want 0x and 8 hex digits, e.g. 0x%08x", r.index, uint32(tpmpolicy.DefaultRevocationIndex))
		}
		idx = tpm2.TPMHandle(n)
	}
	out, err := tpm.WithRevocation(uri, idx)
	if err != nil {
		return "", cli.Usage(err)
	}
	return out, nil
}

// revokeFlags are the flags of policy revoke.
type revokeFlags struct {
	signer, before, dir string
}

func revokeCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var f revokeFlags
	c := &cobra.Command{
		Use:   "revoke --signer TPM_URI --before EPOCH [--dir DIR]",
		Short: "On the node: withdraw every approval of a revocable TPM key written at an epoch below EPOCH (advances its NV counter)",
		Long: `On the node: withdraw every approval of a revocable TPM key (created with --revocable)
written at an epoch below EPOCH. The key's revocation counter, an NV counter in the TPM's owner
hierarchy, is advanced to EPOCH; every approval checks counter <= its epoch inside the TPM
(TPM2_PolicyNV), so older approvals stop unlocking the key at the TPM, whatever software runs on
the node, and booting the old firmware again does not bring them back. The counter never goes back.

Typical use, after a firmware or boot-chain fix: 'status' shows the current epoch E; approve the
fixed state at E+1 on the authority's machine (policy approve --epoch E+1), roll the file out,
then on each node 'policy revoke --before E+1'. Approvals at E+1 and later keep working.

Who can: anyone with owner authorization of the TPM (root on the node with the default empty
owner password). What an attacker who does it gains: nothing but denial of service — the key stops
signing until the authority approves at the new epoch; it never makes the key sign.

Interrupted? Run it again: each step is one atomic TPM2_NV_Increment, and a counter already at
EPOCH is left alone. A receipt goes to receipts/ in --dir (default: the key's approvals= directory).`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd.Context(), env, stdout, stderr)
		},
	}
	fs := c.Flags()
	fs.StringVar(&f.signer, "signer", "", "the revocable key's tpm: URI (with approvals=)")
	fs.StringVar(&f.before, "before", "", "the first epoch that stays valid: approvals written below it are withdrawn")
	fs.StringVar(&f.dir, "dir", "", "directory whose receipts/ gets the receipt (default: the key's approvals directory)")
	return c
}

func (f *revokeFlags) run(ctx context.Context, env *environment, stdout, stderr io.Writer) error {
	if err := cli.Required(map[string]string{"signer": f.signer, "before": f.before}); err != nil {
		return err
	}
	before, err := strconv.ParseUint(f.before, 10, 64)
	if err != nil || before == 0 {
		return cli.Usagef("--before %q: want a positive epoch (status shows the current one)", f.before)
	}
	u, err := tpm.ParseURI(f.signer)
	if err != nil {
		return cli.Usage(err)
	}
	if u.Approvals == "" && f.dir == "" {
		return cli.Usagef("--signer names no approvals= directory: give --dir for the receipt")
	}
	if f.dir == "" {
		f.dir = u.Approvals // receipts/ in it; the signer ignores subdirectories
	}
	receipts, err := mkdir(f.dir)
	if err != nil {
		return err
	}
	return env.runOp(stdout, stderr, func(cer *keystore.Ceremony) (*keystore.Outcome, error) {
		return cer.Revoke(ctx, receipts, keystore.RevokeOptions{SignerURI: f.signer, Before: before})
	})
}

// approveEpoch is the revocation epoch policy approve signs for a key
// with binding b: --epoch, or the counter's value read from the TPM of
// --signer. --epoch is refused for a key that is not revocable, and, where
// the TPM can be read, when it is not the current epoch: an approval below
// it is dead on arrival, one above it would survive the next revoke.
func (f *approveFlags) approveEpoch(ctx context.Context, env *environment, stderr io.Writer, b tpmpolicy.Binding) (uint64, error) {
	if !b.Revocable() {
		if f.epoch != 0 {
			return 0, cli.Usagef("--epoch applies to a revocable key; this key's policy is %s", b)
		}
		return 0, nil
	}
	if f.signer == "" {
		if f.epoch == 0 {
			return 0, cli.Usagef("the key's approvals are revocable (%s): give --epoch, its counter's current value (status on the node, or the last policy revoke receipt)", b)
		}
		return f.epoch, nil
	}
	cur, err := env.tpmBackend(stderr).RevocationEpochOf(ctx, f.signer)
	if err != nil {
		return 0, err
	}
	if f.epoch != 0 && f.epoch != cur {
		return 0, fmt.Errorf("--epoch %d is not the key's current epoch %d (its revocation counter): an approval below it is refused by the TPM, one above it would outlive the next revoke; nothing was approved", f.epoch, cur)
	}
	return cur, nil
}

// printRevocation prints the revocation part of status.
func printRevocation(w io.Writer, r *tpm.RevocationReport) {
	if r == nil {
		return
	}
	fmt.Fprintf(w, "revocation:   counter NV %s, epoch %d (approvals below it are refused by the TPM)\n", r.Index, r.Epoch)
	fmt.Fprintf(w, "  live:       %s\n", orNone(r.Live))
	fmt.Fprintf(w, "  dead:       %s\n", orNone(r.Dead))
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, " ")
}
