package main

// Key attestation of an existing single-tier CA key: `attest` on the TPM
// host, `verify-attestation` on the auditor's machine, with the
// activation round trip (TPM2_ActivateCredential, TPM 2.0 Part 3 §12.5)
// that proves the attestation key is in the TPM of the EK.

import (
	"encoding/hex"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/attestation"
	"github.com/steward-trustd/steward-trustd/keystore"
)

// attestFlags are the flags of attest.
type attestFlags struct {
	signer, ca, nonce, challenge, out, dir string
	force                                  bool
}

func attestCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var f attestFlags
	c := &cobra.Command{
		Use:   "attest --signer tpm:URI --ca os-ca.crt --nonce HEX --out os-ca.attestation.json | attest --signer tpm:URI --challenge FILE --out FILE",
		Short: "On the TPM host: prove to an auditor that the CA key was created in this TPM",
		Long: `Round 1 (--nonce, given by the auditor): the TPM certifies the creation of the CA key
(TPM2_CertifyCreation by an attestation key, over the CA certificate and the nonce) and
--out receives the evidence with the EK certificate. Give it to the auditor's
verify-attestation. Round 2 (--challenge, from verify-attestation): the TPM opens the
challenge with TPM2_ActivateCredential, which only the TPM holding the attested EK and
attestation key can do; --out receives the response for the auditor.
Only keys created by this tool in the TPM (with their .creation.json evidence) can be
attested; see status.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(); err != nil {
				return err
			}
			out, err := outTarget(f.out)
			if err != nil {
				return err
			}
			rd, err := mkdir(f.receipts())
			if err != nil {
				return err
			}
			be := env.tpmBackend(stderr)
			return env.runOp(stdout, stderr, func(cer *keystore.Ceremony) (*keystore.Outcome, error) {
				if f.challenge != "" {
					data, err := readBounded(f.challenge)
					if err != nil {
						return nil, err
					}
					return cer.AttestRespond(cmd.Context(), rd, keystore.RespondOptions{SignerURI: f.signer, TPM: be, Challenge: data, Out: out, Force: f.force})
				}
				ca, err := readCA(f.ca)
				if err != nil {
					return nil, err
				}
				nonce, _ := hex.DecodeString(f.nonce)
				return cer.Attest(cmd.Context(), rd, keystore.AttestOptions{SignerURI: f.signer, CA: ca, Nonce: nonce, TPM: be, Out: out, Force: f.force})
			})
		},
	}
	fs := c.Flags()
	fs.StringVar(&f.signer, "signer", "", "CA key URI (tpm:path=…)")
	fs.StringVar(&f.ca, "ca", "", "round 1: the CA certificate of the key")
	fs.StringVar(&f.nonce, "nonce", "", "round 1: the auditor's nonce, hex (1-64 bytes)")
	fs.StringVar(&f.challenge, "challenge", "", "round 2: the auditor's challenge file")
	fs.StringVar(&f.out, "out", "", "evidence (round 1) or response (round 2) file")
	fs.StringVar(&f.dir, "dir", "", "ceremony directory for the receipt (default: the directory of --ca, or of --out)")
	fs.BoolVar(&f.force, "force", false, "replace --out")
	return c
}

func (f attestFlags) check() error {
	if err := cli.Required(map[string]string{"signer": f.signer, "out": f.out}); err != nil {
		return err
	}
	switch {
	case f.challenge != "" && (f.ca != "" || f.nonce != ""):
		return cli.Usagef("--challenge (round 2) takes neither --ca nor --nonce")
	case f.challenge != "":
		return nil
	case f.ca == "" || f.nonce == "":
		return cli.Usagef("give --ca and --nonce (round 1), or --challenge (round 2)")
	}
	return checkNonce(f.nonce)
}

func (f attestFlags) receipts() string {
	switch {
	case f.dir != "":
		return f.dir
	case f.ca != "":
		return dirOf(f.ca)
	}
	return dirOf(f.out)
}

func checkNonce(s string) error {
	b, err := hex.DecodeString(s)
	if err != nil || len(b) == 0 || len(b) > 64 {
		return cli.Usagef("--nonce must be 1 to 64 bytes in hex")
	}
	return nil
}

// readBounded reads a file of at most attestation.MaxFileSize bytes.
func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only
	data, err := io.ReadAll(io.LimitReader(f, attestation.MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > attestation.MaxFileSize {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, attestation.MaxFileSize)
	}
	return data, nil
}
