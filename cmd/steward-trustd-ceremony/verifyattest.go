package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/attestation"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// verifyAttestFlags are the flags of verify-attestation.
type verifyAttestFlags struct {
	in, ca, nonce, challengeOut, challenge, response, dir string
	expect                                                expectFlags
	force                                                 bool
}

// expectFlags say what a verifier of attestation evidence expects:
// verify-attestation's and intermediate sign's.
type expectFlags struct {
	ekRoots, pcrDigest, pcrs string
	systemd                  bool
	authorities              []string
	// ekPin and ekPins are intermediate sign's (registerPins).
	ekPin, ekPins string
}

func (e *expectFlags) register(c *cobra.Command) {
	fs := c.Flags()
	fs.StringVar(&e.ekRoots, "ek-roots", "", "PEM bundle of trusted EK root (and intermediate) certificates of the TPM vendors")
	cli.ListVar(fs, &e.authorities, "policy-authority", nil, "the attested key is under these policy authorities (file:/pkcs11: key URIs, in creation order) instead of fixed PCR values")
	fs.StringVar(&e.pcrDigest, "pcr-digest", "", "expected creation PCR digest, hex (SHA-256 over the golden PCR values)")
	fs.StringVar(&e.pcrs, "pcrs", "", "the sha256 PCR selection the key was created with (its pcrs=; under --policy-authority also bound in its policy), e.g. 0,7 (default 7)")
	fs.BoolVar(&e.systemd, "systemd-compatible", false, "the key under --policy-authority was created --systemd-compatible (PCR 11, empty policyRef)")
}

// selection is the creation PCR selection the flags expect and, for a
// key under policy authorities, the binding its policy must name.
func (e *expectFlags) selection() ([]int, tpmpolicy.Binding, error) {
	switch {
	case e.systemd && (len(e.authorities) == 0 || e.pcrs != ""):
		return nil, tpmpolicy.Binding{}, cli.Usagef("--systemd-compatible applies to a key under --policy-authority, and fixes its selection to PCR %d: drop --pcrs", tpmpolicy.SystemdPCR)
	case e.systemd:
		return []int{tpmpolicy.SystemdPCR}, tpmpolicy.SystemdBinding(), nil
	}
	pcrs := []int{attestation.DefaultPCR}
	if e.pcrs != "" {
		var err error
		if pcrs, err = tpmpolicy.ParsePCRs(e.pcrs); err != nil {
			return nil, tpmpolicy.Binding{}, cli.Usage(err)
		}
	}
	b, err := tpmpolicy.BindingForPCRs(pcrs)
	if err != nil {
		return nil, tpmpolicy.Binding{}, cli.Usage(err)
	}
	return pcrs, b, nil
}

func (e *expectFlags) check() error {
	if _, _, err := e.selection(); err != nil {
		return err
	}
	if e.pcrDigest != "" {
		if b, err := hex.DecodeString(e.pcrDigest); err != nil || len(b) != 32 {
			return cli.Usagef("--pcr-digest must be 32 bytes in hex")
		}
	}
	return nil
}

func verifyAttestationCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var f verifyAttestFlags
	c := &cobra.Command{
		Use:   "verify-attestation --in os-ca.attestation.json --ca os-ca.crt --nonce HEX --ek-roots FILE (--challenge-out FILE | --challenge FILE --response FILE)",
		Short: "On the auditor's machine: verify that the CA key was created in a genuine TPM",
		Long: `Verify attest's evidence from bytes alone: the EK certificate chains to --ek-roots (PEM
roots and intermediates of the TPM vendors; the critical SAN of EK certificates is accepted),
the attestation key is a restricted non-duplicable signing key, the TPM certified the creation
of exactly the key of --ca with --nonce, the key was created in the TPM (sensitiveDataOrigin),
cannot leave it (fixedTPM, fixedParent), signs only under its policy (userWithAuth clear,
adminWithPolicy), and its authPolicy is PolicyPCR(creation PCRs) → CC(Sign), or the signed
policy of --policy-authority. Then --challenge-out receives a challenge sealed to the EK and
attestation key (its secret stays in FILE.secret); the node answers it with attest --challenge,
and verify-attestation --challenge FILE --response FILE checks the answer. Any failed check:
exit 1 naming it, and a receipt of the refusal.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(); err != nil {
				return err
			}
			return f.run(cmd.Context(), env, stdout, stderr)
		},
	}
	fs := c.Flags()
	fs.StringVar(&f.in, "in", "", "the evidence attest wrote")
	fs.StringVar(&f.ca, "ca", "", "the CA certificate the cluster trusts")
	fs.StringVar(&f.nonce, "nonce", "", "the nonce given to attest, hex")
	fs.StringVar(&f.challengeOut, "challenge-out", "", "write the activation challenge for the node here")
	fs.StringVar(&f.challenge, "challenge", "", "the challenge written earlier (its .secret beside it)")
	fs.StringVar(&f.response, "response", "", "the node's response (attest --challenge)")
	fs.StringVar(&f.dir, "dir", "", "ceremony directory for the receipt (default: the directory of --ca)")
	fs.BoolVar(&f.force, "force", false, "replace --challenge-out")
	f.expect.register(c)
	return c
}

func (f verifyAttestFlags) check() error {
	if err := cli.Required(map[string]string{"in": f.in, "ca": f.ca, "nonce": f.nonce, "ek-roots": f.expect.ekRoots}); err != nil {
		return err
	}
	if err := f.expect.check(); err != nil {
		return err
	}
	if (f.challengeOut == "") == (f.challenge == "" || f.response == "") {
		return cli.Usagef("give --challenge-out FILE (first round), or --challenge FILE and --response FILE (second round)")
	}
	return checkNonce(f.nonce)
}

func (f verifyAttestFlags) run(ctx context.Context, env *environment, stdout, stderr io.Writer) error {
	o, err := f.options(ctx, env, stderr)
	if err != nil {
		return err
	}
	rd, err := receiptsDir(f.dir, f.ca)
	if err != nil {
		return err
	}
	cer, err := env.ceremony(stderr)
	if err != nil {
		return err
	}
	res, out, err := cer.VerifyAttestation(rd, *o)
	if err != nil {
		return err
	}
	printAttestation(stdout, res)
	printOutcome(stdout, out)
	return nil
}

// options reads the files the flags name.
func (f verifyAttestFlags) options(ctx context.Context, env *environment, stderr io.Writer) (*keystore.VerifyAttestationOptions, error) {
	exp, err := f.expect.expectations(ctx, env, stderr)
	if err != nil {
		return nil, err
	}
	ca, err := readCA(f.ca)
	if err != nil {
		return nil, err
	}
	ev, err := readBounded(f.in)
	if err != nil {
		return nil, err
	}
	nonce, _ := hex.DecodeString(f.nonce)
	o := &keystore.VerifyAttestationOptions{Evidence: ev, CA: ca, Nonce: nonce, Expect: *exp, Force: f.force}
	if f.challengeOut != "" {
		o.ChallengeOut, err = outTarget(f.challengeOut)
		return o, err
	}
	if o.Secret, err = readBounded(f.challenge + ".secret"); err != nil {
		return nil, fmt.Errorf("the challenge's secret (kept by verify-attestation --challenge-out): %w", err)
	}
	o.Response, err = readBounded(f.response)
	return o, err
}

// expectations reads the EK roots and the expected policy.
func (e *expectFlags) expectations(ctx context.Context, env *environment, stderr io.Writer) (*attestation.Options, error) {
	data, err := readBounded(e.ekRoots)
	if err != nil {
		return nil, err
	}
	roots, err := attestation.ParseEKRoots(data)
	if err != nil {
		return nil, fmt.Errorf("--ek-roots %s: %w", e.ekRoots, err)
	}
	pcrs, b, err := e.selection()
	if err != nil {
		return nil, err
	}
	o := &attestation.Options{EKRoots: roots, PCRs: pcrs}
	if e.pcrDigest != "" {
		o.PCRDigest, _ = hex.DecodeString(e.pcrDigest)
	}
	if len(e.authorities) == 0 {
		return o, nil
	}
	pubs, err := env.authorityKeys(ctx, stderr, e.authorities)
	if err != nil {
		return nil, err
	}
	// The key's policyRef binds its PCR selection (v2), or is empty
	// (--systemd-compatible): the expected one.
	pol, err := tpmpolicy.SignedPolicyDigestFor(pubs, b)
	if err != nil {
		return nil, err
	}
	o.AuthPolicies = [][]byte{pol}
	return o, nil
}

func printAttestation(w io.Writer, r *attestation.Result) {
	fmt.Fprintf(w, "attestation:  verified\n")
	fmt.Fprintf(w, "EK:           %s (issuer %s, root %s)\n", r.EK.Subject, r.EK.Issuer, r.EK.Root)
	fmt.Fprintf(w, "EK cert:      sha256 %s\n", r.EK.SHA256)
	fmt.Fprintf(w, "AK name:      %s\n", r.AKName)
	fmt.Fprintf(w, "key name:     %s\n", r.KeyName)
	fmt.Fprintf(w, "key policy:   %s\n", r.Policy)
	if len(r.PCRs) > 0 {
		fmt.Fprintf(w, "created with: sha256 PCRs %v, digest %s\n", r.PCRs, r.PCRDigest)
	}
}

// dirOf is the directory of a file path.
func dirOf(path string) string { return filepath.Dir(path) }
