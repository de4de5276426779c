package main

// Signed PCR policies: keys created under a policy authority (the
// --policy-authority flag of init, import and rotate), approvals of PCR
// states (policy approve) and the node's proof of its PCR state (policy
// quote). See signer/tpm/README.md, "Signed PCR policies".

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/cmd/internal/tpmdev"
	"github.com/steward-trustd/steward-trustd/internal/atomicfile"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// policyAuthorityUsage is the help of --policy-authority.
const policyAuthorityUsage = "TPM only: create the key under this policy authority (a file: or pkcs11: key URI; repeat or comma-separate for a break-glass second authority, PolicyOR) instead of fixed PCR values; the --signer URI must name approvals=DIR, and today's PCR values are approved there with the first authority"

// systemdCompatibleUsage is the help of --systemd-compatible.
const systemdCompatibleUsage = "TPM only, with --policy-authority: make the key systemd-compatible (empty policyRef, PCR 11), so that approvals written by systemd-measure sign with the same RSA key unlock it; the PCR selection is then checked in software only (see signer/tpm/README.md)"

// withSystemd makes a tpm: key URI about to be created under authorities
// systemd-compatible (systemd=true).
func withSystemd(uri string, authorities []string) (string, error) {
	if len(authorities) == 0 || !tpm.IsKeyURI(uri) {
		return "", cli.Usagef("--systemd-compatible applies to a tpm: key under a --policy-authority")
	}
	out := uri + ";systemd=true"
	if _, err := tpm.ParseURI(out); err != nil {
		return "", cli.Usage(err)
	}
	return out, nil
}

// tpmBackend is the TPM backend for reading PCRs and quoting, outside any key.
func (e *environment) tpmBackend(stderr io.Writer) *tpm.Backend {
	dial := e.tpmDial
	if dial == nil {
		dial = tpmdev.Dial
	}
	return &tpm.Backend{Dial: dial, Logger: e.warnings.logger(stderr)}
}

// authorities checks --policy-authority against the key URI and returns
// keystore's request for it: keystore approves the TPM's current PCR
// values with the first authority and creates the key under them, under
// the ceremony directory's lock, resuming an interrupted run.
func (e *environment) authorities(stderr io.Writer, uri string, auths []string) (keystore.Authorities, error) {
	if len(auths) == 0 {
		return keystore.Authorities{}, nil
	}
	if !tpm.IsKeyURI(uri) {
		return keystore.Authorities{}, cli.Usagef("--policy-authority applies to tpm: keys only")
	}
	if u, err := tpm.ParseURI(uri); err != nil {
		return keystore.Authorities{}, cli.Usage(err)
	} else if u.Approvals == "" {
		return keystore.Authorities{}, cli.Usagef("--policy-authority: the key URI must name its approvals directory (add ;approvals=/dir)")
	}
	return keystore.Authorities{URIs: auths, PCRs: e.tpmBackend(stderr)}, nil
}

// authorityKeys opens each authority key URI for its public key.
func (e *environment) authorityKeys(ctx context.Context, stderr io.Writer, uris []string) ([]crypto.PublicKey, error) {
	cer, err := e.ceremony(stderr)
	if err != nil {
		return nil, err
	}
	pubs := make([]crypto.PublicKey, 0, len(uris))
	for _, u := range uris {
		s, err := cer.Keys.Open(ctx, u)
		if err != nil {
			return nil, fmt.Errorf("open policy authority: %w%s", err, keystore.AuthorityHint(err))
		}
		pubs = append(pubs, s.Public())
		if err := s.Close(); err != nil {
			return nil, fmt.Errorf("close policy authority: %w", err)
		}
	}
	return pubs, nil
}

func policyCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	c := &cobra.Command{
		Use:   "policy",
		Short: "Signed PCR policies: approve PCR states for a TPM key under a policy authority, prove a node's PCR state",
	}
	authority := &cobra.Command{Use: "authority", Short: "The policy authority's key: create one"}
	authority.AddCommand(authorityCreateCmd(env, stdout, stderr))
	c.AddCommand(approveCmd(env, stdout, stderr), quoteCmd(env, stdout, stderr), revokeCmd(env, stdout, stderr), authority)
	return c
}

// authorityCreateFlags are the flags of policy authority create.
type authorityCreateFlags struct {
	key, algorithm, publicOut string
	force                     bool
}

func authorityCreateCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var f authorityCreateFlags
	c := &cobra.Command{
		Use:   "create --key AUTH_URI [--algorithm p256|rsa2048|rsa3072|rsa4096] [--public-out FILE]",
		Short: "Create a policy authority key (on an offline machine or an HSM) and print what identifies it",
		Long: `Create the key that approves PCR states for TPM keys created under it
(init/rotate/intermediate --policy-authority). Keep it offline: a file: key on a machine
that never joins the network, or a pkcs11: key on an HSM or YubiKey. It is never
overwritten.

--public-out writes its public key (PEM, not secret) for the nodes' ceremonies
(--policy-authority takes the public key's owner URI; status shows the fingerprints).
Choose rsa2048 (or larger) to sign systemd-measure approvals with the same key
(--systemd-compatible keys): systemd-measure signs with RSA.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd.Context(), env, stdout, stderr)
		},
	}
	fs := c.Flags()
	fs.StringVar(&f.key, "key", "", "where to create the authority key: file:/offline/authority.key or a pkcs11: URI")
	fs.StringVar(&f.algorithm, "algorithm", "p256", "p256, or rsa2048/rsa3072/rsa4096 (to share the key with systemd-measure)")
	fs.StringVar(&f.publicOut, "public-out", "", "write the public key (PEM) to this file")
	fs.BoolVar(&f.force, "force", false, "replace an existing --public-out file (the key itself is never replaced)")
	return c
}

func (f *authorityCreateFlags) run(ctx context.Context, env *environment, stdout, stderr io.Writer) (err error) {
	if err := cli.Required(map[string]string{"key": f.key}); err != nil {
		return err
	}
	alg, err := parseAlgorithm(f.algorithm)
	if err != nil {
		return err
	}
	cer, err := env.ceremony(stderr)
	if err != nil {
		return err
	}
	s, err := cer.Keys.Generate(ctx, f.key, alg)
	if err != nil {
		return fmt.Errorf("create the policy authority: %w", err)
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	a, err := tpmpolicy.NewAuthority(s.Public())
	if err != nil {
		return fmt.Errorf("the new key cannot be a policy authority: %w", err)
	}
	if f.publicOut != "" {
		der, err := x509.MarshalPKIXPublicKey(a.Public())
		if err != nil {
			return err
		}
		if err := writeOutput(stdout, f.publicOut, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), f.force); err != nil {
			return err
		}
	}
	printAuthority(stdout, f.key, a)
	return nil
}

// printAuthority says what identifies a new authority and what to do next.
// A pkcs11: URI is shown with its pin-value redacted.
func printAuthority(w io.Writer, uri string, a *tpmpolicy.Authority) {
	if u, err := pkcs11.ParseURI(uri); err == nil {
		uri = u.String()
	}
	fmt.Fprintf(w, "policy authority created: %s\n", uri)
	fmt.Fprintf(w, "fingerprint:  sha256 %s (pkfp of our approvals)\n", a.Fingerprint())
	if fp := a.SystemdFingerprint(); fp != "" {
		fmt.Fprintf(w, "systemd pkfp: %s (systemd-measure's)\n", fp)
	}
	fmt.Fprintf(w, "TPM name:     %x\n", a.Name())
	fmt.Fprintf(w, "next: steward-trustd-ceremony init --signer 'tpm:path=/etc/steward-trustd/os-ca.tpmkey;approvals=/etc/steward-trustd/approvals' --policy-authority '%s' --cluster NAME --out DIR\n", uri)
}

// approveFlags are the flags of policy approve.
type approveFlags struct {
	authority, signer, key, fromQuote, ak, nonce string
	note, approvedBy, out, approvals, dir        string
	pcrs                                         []string
	force                                        bool
	epoch                                        uint64
}

func approveCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var f approveFlags
	c := &cobra.Command{
		Use:   "approve --authority AUTH_URI (--key KEY.tpmkey | --signer TPM_URI) [--pcr 7=HEX ... | --from-quote FILE --ak AK.pem --nonce HEX] [--note TEXT] [--out FILE | --approvals DIR]",
		Short: "Sign an approval of a PCR state with the policy authority, so that the TPM key can sign in that state",
		Long: `Sign an approval of a PCR state with the policy authority.

The key is named by --key (its blob file, not secret: copy it to the authority's
machine) or --signer (its URI on the node). A key's PCR selection is fixed when it is
created and bound in its policy (the policyRef of its PolicyAuthorize): the approval
signs that ref, so the TPM refuses it for any other selection; an approval over
another selection is refused here, and the selection is printed first.

The state comes from the TPM itself (--signer alone, e.g. a canary node after a
firmware update), from the command line (--pcr 7=HEX, repeatable), or, best, from a
quote the node made with 'policy quote' over your nonce (--from-quote, checked against
the attestation key pinned with 'policy quote --ak-out' and your --nonce).

The approval goes to --out FILE, or into --approvals DIR (default: the approvals=
directory of --signer) as DATE-DIGEST.json. An approval lets a key created under this
authority sign when its PCRs hold exactly these values; nothing else. It never
expires: retire it by removing the file from every node.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd.Context(), env, stdout, stderr)
		},
	}
	fs := c.Flags()
	fs.StringVar(&f.authority, "authority", "", "policy authority key URI (file: or pkcs11:)")
	fs.StringVar(&f.signer, "signer", "", "the key's tpm: URI; alone, also read the PCR values to approve from its TPM")
	fs.StringVar(&f.key, "key", "", "the key's blob file (KEY.tpmkey, not secret): its policy names the PCR selection and policyRef to approve")
	cli.ListVar(fs, &f.pcrs, "pcr", nil, "approve this sha256 PCR value, INDEX=HEX (repeat for several PCRs)")
	fs.StringVar(&f.fromQuote, "from-quote", "", "approve the PCR values of this quote (from policy quote)")
	fs.StringVar(&f.ak, "ak", "", "with --from-quote: the node's attestation key (PEM, from policy quote --ak-out)")
	fs.StringVar(&f.nonce, "nonce", "", "with --from-quote: the nonce you gave the node (hex)")
	fs.StringVar(&f.note, "note", "", "note recorded in the approval, e.g. \"BIOS 1.2.3\"")
	fs.StringVar(&f.approvedBy, "approved-by", "", "who approves (default: the authority's fingerprint)")
	fs.StringVar(&f.out, "out", "", "approval file to write")
	fs.StringVar(&f.approvals, "approvals", "", "approvals directory to write into (default: the approvals= of --signer)")
	fs.StringVar(&f.dir, "dir", "", "directory for the receipt (default: the directory of the approval file)")
	fs.BoolVar(&f.force, "force", false, "replace an existing approval file")
	fs.Uint64Var(&f.epoch, "epoch", 0, "revocable keys: the revocation epoch to approve at (the counter's current value; default with --signer: read from its TPM)")
	return c
}

func (f *approveFlags) run(ctx context.Context, env *environment, stdout, stderr io.Writer) error {
	if err := cli.Required(map[string]string{"authority": f.authority}); err != nil {
		return err
	}
	if err := f.checkSources(); err != nil {
		return err
	}
	binding, err := f.binding()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "key policy: %s\n", binding)
	if w := binding.Weakness(); w != "" {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	pcrs, vals, source, err := f.state(ctx, env, stderr, binding)
	if err != nil {
		return err
	}
	if want := binding.PCRs(); want != nil && !slices.Equal(pcrs, want) {
		return fmt.Errorf("the state to approve selects sha256 PCRs %s, but the key accepts only %s (fixed at creation, bound in its policy); nothing was approved: approve the key's own PCRs", pcrList(pcrs), pcrList(want))
	}
	epoch, err := f.approveEpoch(ctx, env, stderr, binding)
	if err != nil {
		return err
	}
	target, err := f.target(env.clock(), pcrs, vals)
	if err != nil {
		return err
	}
	receipts, err := receiptsDir(f.dir, target.Dir.Path(target.Name))
	if err != nil {
		return err
	}
	return env.runOp(stdout, stderr, func(cer *keystore.Ceremony) (*keystore.Outcome, error) {
		return cer.Approve(ctx, receipts, keystore.ApproveOptions{
			AuthorityURI: f.authority, Binding: binding, PCRs: pcrs, Values: vals, Source: source,
			ApprovedBy: f.approvedBy, Note: f.note, Out: target, Force: f.force, Epoch: epoch,
		})
	})
}

// binding reads the binding of the key named by --key or --signer.
func (f *approveFlags) binding() (tpmpolicy.Binding, error) {
	uri := f.signer
	if f.key != "" {
		abs, err := filepath.Abs(f.key)
		if err != nil {
			return tpmpolicy.Binding{}, err
		}
		uri = "tpm:path=" + abs
	}
	b, _, err := tpm.KeyBinding(uri)
	if errors.Is(err, signer.ErrInvalidURI) {
		return tpmpolicy.Binding{}, cli.Usage(err)
	}
	return b, err
}

// checkSources checks that the flags name the key and one source of the
// state to approve.
func (f *approveFlags) checkSources() error {
	switch {
	case f.key == "" && f.signer == "":
		return cli.Usagef("name the key the approval is for: --key KEY.tpmkey (its blob file, not secret) or --signer TPM_URI; its policy fixes the PCR selection and the policyRef the approval signs")
	case len(f.pcrs) > 0 && f.fromQuote != "":
		return cli.Usagef("give at most one of --pcr and --from-quote")
	case len(f.pcrs) == 0 && f.fromQuote == "" && f.signer == "":
		return cli.Usagef("give the state to approve: --pcr 7=HEX, --from-quote FILE, or --signer to read it from the key's TPM")
	case (f.ak != "" || f.nonce != "") && f.fromQuote == "":
		return cli.Usagef("--ak and --nonce apply to --from-quote")
	}
	return nil
}

// state returns the PCR state to approve from exactly one source: --pcr,
// --from-quote, or else the TPM of --signer (read over the key's bound
// selection).
func (f *approveFlags) state(ctx context.Context, env *environment, stderr io.Writer, b tpmpolicy.Binding) ([]int, [][]byte, string, error) {
	switch {
	case len(f.pcrs) == 0 && f.fromQuote == "":
		uri, err := tpm.WithPCRs(f.signer, b.PCRs())
		if err != nil {
			return nil, nil, "", cli.Usage(err)
		}
		pcrs, vals, err := env.tpmBackend(stderr).ReadPCRValues(ctx, uri)
		return pcrs, vals, "tpm", err
	case f.fromQuote != "":
		pcrs, vals, err := f.quoted()
		return pcrs, vals, "quote", err
	}
	pcrs, vals, err := parsePCRValues(f.pcrs)
	return pcrs, vals, "pcr", err
}

// parsePCRValues parses INDEX=HEX items into a selection and its values.
func parsePCRValues(items []string) ([]int, [][]byte, error) {
	byPCR := map[int][]byte{}
	for _, it := range items {
		k, v, ok := strings.Cut(it, "=")
		p, err := strconv.Atoi(k)
		if !ok || err != nil || p < 0 || p > tpmpolicy.MaxPCR {
			return nil, nil, cli.Usagef("--pcr %q: want INDEX=HEX with INDEX 0-%d", it, tpmpolicy.MaxPCR)
		}
		b, err := hex.DecodeString(v)
		if err != nil || len(b) != 32 {
			return nil, nil, cli.Usagef("--pcr %q: the value must be 64 hex digits (a sha256 PCR)", it)
		}
		if _, dup := byPCR[p]; dup {
			return nil, nil, cli.Usagef("--pcr: PCR %d given twice", p)
		}
		byPCR[p] = b
	}
	pcrs := make([]int, 0, len(byPCR))
	for p := range byPCR {
		pcrs = append(pcrs, p)
	}
	slices.Sort(pcrs)
	if _, err := tpmpolicy.ParsePCRs(pcrList(pcrs)); err != nil {
		return nil, nil, cli.Usage(err) // a resettable PCR
	}
	vals := make([][]byte, len(pcrs))
	for i, p := range pcrs {
		vals[i] = byPCR[p]
	}
	return pcrs, vals, nil
}

// quoted verifies --from-quote against --ak and --nonce.
func (f *approveFlags) quoted() ([]int, [][]byte, error) {
	if err := cli.Required(map[string]string{"ak": f.ak, "nonce": f.nonce}); err != nil {
		return nil, nil, err
	}
	nonce, err := hex.DecodeString(f.nonce)
	if err != nil || len(nonce) == 0 {
		return nil, nil, cli.Usagef("--nonce must be hex")
	}
	ak, err := readAK(f.ak)
	if err != nil {
		return nil, nil, err
	}
	data, err := readSmall(f.fromQuote)
	if err != nil {
		return nil, nil, err
	}
	var q tpmpolicy.Quote
	if err := json.Unmarshal(data, &q); err != nil {
		return nil, nil, fmt.Errorf("%s: not a quote: %w", f.fromQuote, err)
	}
	pcrs, vals, err := tpmpolicy.VerifyQuote(&q, ak, nonce)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w; nothing was approved", f.fromQuote, err)
	}
	return pcrs, vals, nil
}

// pcrList renders a PCR selection as --pcrs and pcrs= take it: "7,11".
func pcrList(pcrs []int) string {
	s := make([]string, len(pcrs))
	for i, p := range pcrs {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

// readSmall reads a file of at most 1 MiB.
func readSmall(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = fh.Close() }() // read only
	data, err := io.ReadAll(io.LimitReader(fh, 1<<20+1))
	if err == nil && len(data) > 1<<20 {
		err = fmt.Errorf("%s: larger than 1 MiB", path)
	}
	return data, err
}

// readAK reads a pinned attestation key (PEM public key).
func readAK(path string) (*ecdsa.PublicKey, error) {
	data, err := readSmall(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("%s: no PUBLIC KEY PEM block", path)
	}
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	k, ok := pub.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("%s: not an ECDSA attestation key", path)
	}
	return k, nil
}

// target is --out, or a new file in --approvals (or the approvals= of
// --signer) named by date and digest.
func (f *approveFlags) target(now time.Time, pcrs []int, vals [][]byte) (keystore.Target, error) {
	if f.out != "" {
		if f.approvals != "" {
			return keystore.Target{}, cli.Usagef("give --out or --approvals, not both")
		}
		return outTarget(f.out)
	}
	dir := f.approvals
	if dir == "" && f.signer != "" {
		u, err := tpm.ParseURI(f.signer)
		if err != nil {
			return keystore.Target{}, cli.Usage(err)
		}
		dir = u.Approvals
	}
	if dir == "" {
		return keystore.Target{}, cli.Usagef("say where the approval goes: --out FILE or --approvals DIR")
	}
	pol, err := tpmpolicy.PCRPolicyDigest(pcrs, vals)
	if err != nil {
		return keystore.Target{}, err
	}
	d, err := mkdir(dir)
	if err != nil {
		return keystore.Target{}, err
	}
	return keystore.Target{Dir: d, Name: now.UTC().Format("20060102T150405.000Z") + "-" + hex.EncodeToString(pol)[:16] + ".json"}, nil
}

// quoteFlags are the flags of policy quote.
type quoteFlags struct {
	signer, nonce, out, akOut string
	force                     bool
}

func quoteCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var f quoteFlags
	c := &cobra.Command{
		Use:   "quote --signer TPM_URI (--nonce HEX --out quote.json | --ak-out ak.pem)",
		Short: "On the node: prove its PCR state with a TPM2_Quote over the approver's nonce, or export the attestation key to pin",
		Long: `On the node: prove its PCR state to the approver.

--ak-out writes the public key of the TPM's attestation key (a restricted signing
primary derived from the owner seed with a fixed template: the same key every time on
the same TPM). Pin it once, over a trusted channel, for each node.

--nonce HEX --out FILE quotes the sha256 PCRs of --signer (its pcrs=, default 7) with
the approver's nonce. The approver runs 'policy approve --from-quote FILE --ak AK.pem
--nonce HEX', which refuses a quote by another key, with another nonce, or whose PCR
values do not give the quoted digest.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd.Context(), env, stdout, stderr)
		},
	}
	fs := c.Flags()
	fs.StringVar(&f.signer, "signer", "", "tpm: key URI naming the TPM and the PCRs (pcrs=, default 7)")
	fs.StringVar(&f.nonce, "nonce", "", "the approver's nonce, hex (up to 32 bytes)")
	fs.StringVar(&f.out, "out", "", "quote file to write")
	fs.StringVar(&f.akOut, "ak-out", "", "write the attestation key's public key (PEM) to this file")
	fs.BoolVar(&f.force, "force", false, "replace existing output files")
	return c
}

func (f *quoteFlags) run(ctx context.Context, env *environment, stdout, stderr io.Writer) error {
	if err := cli.Required(map[string]string{"signer": f.signer}); err != nil {
		return err
	}
	if f.akOut == "" && f.nonce == "" {
		return cli.Usagef("give --nonce HEX --out FILE to quote, or --ak-out FILE to export the attestation key")
	}
	if (f.nonce == "") != (f.out == "") {
		return cli.Usagef("--nonce and --out go together")
	}
	b := env.tpmBackend(stderr)
	if f.akOut != "" {
		if err := f.writeAK(ctx, b, stdout); err != nil {
			return err
		}
	}
	if f.nonce == "" {
		return nil
	}
	nonce, err := hex.DecodeString(f.nonce)
	if err != nil || len(nonce) == 0 || len(nonce) > tpmpolicy.MaxNonce {
		return cli.Usagef("--nonce must be 1 to %d bytes of hex", tpmpolicy.MaxNonce)
	}
	q, err := b.Quote(ctx, f.signer, nonce)
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(q, "", "  ")
	if err != nil {
		return err
	}
	return writeOutput(stdout, f.out, append(data, '\n'), f.force)
}

func (f *quoteFlags) writeAK(ctx context.Context, b *tpm.Backend, stdout io.Writer) error {
	ak, err := b.AttestationKey(ctx, f.signer)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKIXPublicKey(ak)
	if err != nil {
		return err
	}
	return writeOutput(stdout, f.akOut, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), f.force)
}

// writeOutput writes a non-secret output file atomically.
func writeOutput(stdout io.Writer, path string, data []byte, force bool) error {
	if err := atomicfile.Write(path, data, 0o644, force); err != nil {
		if errors.Is(err, fs.ErrExist) || errors.Is(err, atomicfile.ErrExists) {
			return fmt.Errorf("%w; pass --force to replace it", err)
		}
		return err
	}
	fmt.Fprintf(stdout, "wrote %s\n", path)
	return nil
}

// printSignedPolicy prints the signed-policy part of status.
func printSignedPolicy(w io.Writer, r *tpm.PolicyReport) {
	if r == nil {
		return
	}
	for _, a := range r.Authorities {
		fmt.Fprintf(w, "authority:    sha256 %s, TPM name %s\n", a.Fingerprint, a.Name)
		if a.SystemdFingerprint != "" {
			fmt.Fprintf(w, "              systemd-measure pkfp %s\n", a.SystemdFingerprint)
		}
	}
	bound := "not bound"
	if len(r.BoundPCRs) > 0 {
		bound = "sha256:" + pcrList(r.BoundPCRs)
	}
	fmt.Fprintf(w, "key policy:   %s, policyRef %q, PCR selection %s\n", r.Binding, r.PolicyRef, bound)
	if r.Warning != "" {
		fmt.Fprintf(w, "WARNING:      %s\n", r.Warning)
	}
	fmt.Fprintf(w, "approvals:    %s (%d usable)\n", r.ApprovalsDir, r.Approvals)
	pcrs := make([]string, 0, len(r.PCRValues))
	for p, v := range r.PCRValues {
		pcrs = append(pcrs, fmt.Sprintf("%s=%s", p, v))
	}
	slices.Sort(pcrs)
	fmt.Fprintf(w, "PCR state:    %s (PolicyPCR digest %s)\n", strings.Join(pcrs, " "), r.PolicyPCRDigest)
	printRevocation(w, r.Revocation)
	if r.Matching != "" {
		fmt.Fprintf(w, "approved by:  %s\n", r.Matching)
	} else {
		fmt.Fprintf(w, "approved by:  NO APPROVAL matches the current PCR state\n")
	}
}
