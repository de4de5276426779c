package main

// Attested enrolment: intermediate request --attest on the
// node, intermediate sign --ek-roots on the root's host, intermediate
// install on the node.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/attestation"
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

// registerPins adds intermediate sign's EK pins.
func (e *expectFlags) registerPins(c *cobra.Command) {
	flags := c.Flags()
	flags.StringVar(&e.ekPin, "ek-pin", "", "with --ek-roots: accept only this EK (its certificate file, or the hex SHA-256 of its DER as verify-attestation prints it)")
	flags.StringVar(&e.ekPins, "ek-pins", "", "with --ek-roots: file of NODE-NAME EK-FINGERPRINT lines; the request's name must be listed and its EK must be the pinned one")
}

// checkEnrol refuses expectations without the EK roots they refine.
func (e *expectFlags) checkEnrol() error {
	if e.ekRoots == "" && (e.pcrDigest != "" || len(e.authorities) > 0 || e.ekPin != "" || e.ekPins != "") {
		return cli.Usagef("--pcr-digest, --policy-authority, --ek-pin and --ek-pins refine --ek-roots; give --ek-roots too")
	}
	if e.ekPin != "" && e.ekPins != "" {
		return cli.Usagef("give --ek-pin (one EK for this request) or --ek-pins (a file per node), not both")
	}
	return e.check()
}

// pins reads --ek-pin or --ek-pins; nil without them.
func (e *expectFlags) pins() (attestation.EKPins, error) {
	switch {
	case e.ekPins != "":
		data, err := readBounded(e.ekPins)
		if err != nil {
			return nil, err
		}
		p, err := attestation.ParseEKPins(data)
		if err != nil {
			return nil, cli.Usagef("--ek-pins %s: %v", e.ekPins, err)
		}
		return p, nil
	case e.ekPin != "":
		file, err := readBounded(e.ekPin)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		fp, err := attestation.ParseEKFingerprint(e.ekPin, file)
		if err != nil {
			return nil, cli.Usagef("--ek-pin: %v", err)
		}
		return attestation.EKPins{"*": fp}, nil
	}
	return nil, nil
}

// readAttestedRequest reads --csr for intermediate sign --ek-roots and
// says what to do when it is the plain PEM CSR instead.
func readAttestedRequest(path string) ([]byte, error) {
	req, err := readBounded(path)
	if err != nil {
		return nil, err
	}
	if bytes.Contains(req, []byte("-----BEGIN CERTIFICATE REQUEST-----")) || bytes.Contains(req, []byte("-----BEGIN NEW CERTIFICATE REQUEST-----")) {
		return nil, cli.Usagef("--csr %s is a plain PEM certificate request; with --ek-roots give the node's attested request instead (the .attested.json file `intermediate request --attest` wrote next to it)", path)
	}
	return req, nil
}

// attestedWithoutRoots turns readCSR's error for an attested request
// given to intermediate sign without --ek-roots into what to do.
func attestedWithoutRoots(path string, err error) error {
	data, rerr := readBounded(path)
	if rerr != nil {
		return err
	}
	if _, perr := attestation.ParseRequest(data); perr == nil {
		return cli.Usagef("--csr %s is an attested request (.attested.json); add --ek-roots EK-ROOTS.pem to verify its evidence, or give the plain PEM CSR to sign it unattested", path)
	}
	return err
}

// signAttested runs intermediate sign --ek-roots: csrPath names the
// attested request.
func (e *expectFlags) signAttested(cmd *cobra.Command, env *environment, stdout, stderr io.Writer, f *issueFlags, o keystore.IntermediateSignOptions, csrPath string) error {
	req, err := readAttestedRequest(csrPath)
	if err != nil {
		return err
	}
	exp, err := e.expectations(cmd.Context(), env, stderr)
	if err != nil {
		return err
	}
	pins, err := e.pins()
	if err != nil {
		return err
	}
	a := keystore.AttestedSign{Request: req, Expect: *exp, Pins: pins}
	return f.run(cmd, env, stdout, stderr, func(ctx context.Context, cer *keystore.Ceremony, rd keystore.Dir) (*keystore.Outcome, error) {
		_, res, err := cer.IntermediateSignAttested(ctx, rd, o, a)
		return res, err
	})
}

func intermediateInstallCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var o keystore.IntermediateInstallOptions
	var in, out, dir, proofOut string
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
				if proofOut == "" {
					proofOut = d.Path(activationProofFile)
				}
				if o.ProofOut, err = outTarget(proofOut); err != nil {
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
	fs.StringVar(&proofOut, "proof-out", "", "activation proof for the root's intermediate confirm (default: "+activationProofFile+" in --dir)")
	fs.BoolVar(&o.Force, "force", false, "replace --out")
	return c
}

// activationProofFile is install's default --proof-out name.
const activationProofFile = "issuer.activation.json"

func intermediateConfirmCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var proof, dir string
	c := &cobra.Command{
		Use:   "confirm --proof issuer.activation.json --dir ROOT_DIR",
		Short: "On the root's host: record an attested enrolment as attested once the node's TPM proved it opened the sealed intermediate",
		Long: `intermediate sign --ek-roots verifies the node's evidence, but evidence can be built in
software around a borrowed EK certificate, so its receipt says "pending activation". Only the TPM
holding that EK can open the sealed intermediate (TPM2_ActivateCredential); intermediate install
then writes the activation secret sealed with it. confirm checks that secret against the
commitment in the enrolment's receipt and records "attested". A wrong proof: exit 1 and a
receipt of the refusal.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Required(map[string]string{"proof": proof, "dir": dir}); err != nil {
				return err
			}
			data, err := readBounded(proof)
			if err != nil {
				return err
			}
			return env.runOp(stdout, stderr, func(cer *keystore.Ceremony) (*keystore.Outcome, error) {
				return cer.IntermediateConfirm(keystore.OSDir{Root: dir}, data)
			})
		},
	}
	c.Flags().StringVar(&proof, "proof", "", "the activation proof intermediate install wrote on the node")
	c.Flags().StringVar(&dir, "dir", "", "the root's ceremony directory that signed the enrolment (its receipts)")
	return c
}
