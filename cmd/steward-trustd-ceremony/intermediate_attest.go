package main

// Attested enrolment (issue 13): intermediate request --attest on the
// node, intermediate sign --ek-roots on the root's host, intermediate
// install on the node.

import (
	"context"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
)

// attestRequest writes the attested request for the CSR request just
// wrote.
func (e *environment) attestRequest(ctx context.Context, stdout, stderr io.Writer, o keystore.IntermediateRequestOptions, attestOut, dir string) error {
	csr, err := os.ReadFile(o.Out.Dir.Path(o.Out.Name))
	if err != nil {
		return err
	}
	out, err := outTarget(attestOut)
	if err != nil {
		return err
	}
	be := e.tpmBackend(stderr)
	return e.runOp(stdout, stderr, func(cer *keystore.Ceremony) (*keystore.Outcome, error) {
		d, err := receiptsDir(dir, o.Out.Dir.Path(o.Out.Name))
		if err != nil {
			return nil, err
		}
		return cer.IntermediateAttest(ctx, d, keystore.IntermediateAttestOptions{SignerURI: o.SignerURI, CSR: csr, TPM: be, Out: out})
	})
}

// checkEnrol refuses expectations without the EK roots they refine.
func (e *expectFlags) checkEnrol() error {
	if e.ekRoots == "" && (e.pcrDigest != "" || len(e.authorities) > 0) {
		return cli.Usagef("--pcr-digest and --policy-authority refine --ek-roots; give --ek-roots too")
	}
	return e.check()
}

// signAttested runs intermediate sign --ek-roots: csrPath names the
// attested request.
func (e *expectFlags) signAttested(cmd *cobra.Command, env *environment, stdout, stderr io.Writer, f *issueFlags, o keystore.IntermediateSignOptions, csrPath string) error {
	req, err := readBounded(csrPath)
	if err != nil {
		return err
	}
	exp, err := e.expectations(cmd.Context(), env, stderr)
	if err != nil {
		return err
	}
	a := keystore.AttestedSign{Request: req, Expect: *exp}
	return f.run(cmd, env, stdout, stderr, func(ctx context.Context, cer *keystore.Ceremony, rd keystore.Dir) (*keystore.Outcome, error) {
		_, res, err := cer.IntermediateSignAttested(ctx, rd, o, a)
		return res, err
	})
}

func intermediateInstallCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var o keystore.IntermediateInstallOptions
	var in, out, dir string
	c := &cobra.Command{
		Use:   "install --signer tpm:URI --in FILE --out issuer.crt",
		Short: "On the node: open the intermediate sealed to this TPM (TPM2_ActivateCredential) and write issuer.crt",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Required(map[string]string{"signer": o.SignerURI, "in": in, "out": out}); err != nil {
				return err
			}
			if !tpm.IsKeyURI(o.SignerURI) {
				return cli.Usagef("--signer must be the node's tpm: key (the intermediate is sealed to its TPM)")
			}
			var err error
			if o.Sealed, err = readBounded(in); err != nil {
				return err
			}
			if o.Out, err = outTarget(out); err != nil {
				return err
			}
			o.TPM = env.tpmBackend(stderr)
			return env.runOp(stdout, stderr, func(cer *keystore.Ceremony) (*keystore.Outcome, error) {
				d, err := receiptsDir(dir, o.Out.Dir.Path(o.Out.Name))
				if err != nil {
					return nil, err
				}
				_, res, err := cer.IntermediateInstall(cmd.Context(), d, o)
				return res, err
			})
		},
	}
	fs := c.Flags()
	fs.StringVar(&o.SignerURI, "signer", "", "the node's intermediate key (tpm:path=…)")
	fs.StringVar(&in, "in", "", "the sealed intermediate intermediate sign --ek-roots wrote")
	fs.StringVar(&out, "out", "", "issuer.crt output file")
	fs.StringVar(&dir, "dir", "", "ceremony directory of this node, for the receipt (default: the directory of --out)")
	fs.BoolVar(&o.Force, "force", false, "replace --out")
	return c
}
