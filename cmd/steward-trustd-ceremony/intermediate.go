package main

// The tiered setup: `intermediate request` on each trustd node, then
// `intermediate sign` on the root's (offline) host.

import (
	"context"
	"io"
	"net"
	"net/netip"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
)

func intermediateCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	c := &cobra.Command{
		Use:   "intermediate",
		Short: "Tiered CA: a device-held, ServerAuth-only intermediate per trustd node under an offline root",
		Long: `The tiered setup keeps the OS CA (the root: machine.ca.crt, the talosconfig ca) offline and gives
each trustd node its own intermediate, whose key never leaves the node's TPM or HSM:
  1. on the node:       intermediate request --signer URI --name NODE --out node.csr
  2. on the root's host: intermediate sign --signer ROOT_URI --ca os-ca.crt --csr node.csr --out issuer.crt
  3. issuer.crt goes into the node's cert dir next to os-ca.crt (or $TRUSTD_ISSUER_CRT).
The intermediate has EKU exactly [ServerAuth] and path length 0: a compromised node can sign
apid serving certificates (limit them with --permitted-ip-ranges), never talosctl credentials.`,
	}
	c.AddCommand(intermediateRequestCmd(env, stdout, stderr), intermediateSignCmd(env, stdout, stderr), intermediateInstallCmd(env, stdout, stderr), intermediateConfirmCmd(env, stdout, stderr))
	return c
}

func intermediateRequestCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var o keystore.IntermediateRequestOptions
	var k keyFlags
	var out, dir, attestOut string
	c := &cobra.Command{
		Use:   "request --signer URI --name NAME --out FILE [--attest node.attested.json]",
		Short: "Create the node's intermediate key on its device and write a certificate request signed by it",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Required(map[string]string{"signer": o.SignerURI, "name": o.Name, "out": out}); err != nil {
				return err
			}
			if attestOut != "" && !tpm.IsKeyURI(o.SignerURI) {
				return cli.Usagef("--attest applies to tpm: keys only (a TPM proves where its key is; an HSM's attestation is the vendor's)")
			}
			var err error
			if o.SignerURI, o.Algorithm, err = k.key(o.SignerURI); err != nil {
				return err
			}
			if o.Out, err = outTarget(out); err != nil {
				return err
			}
			if dir == "" {
				dir = o.Out.Dir.Path("")
			}
			// A node key may live under policy authorities too, so that signed
			// PCR approvals keep it usable across OS updates.
			if o.Authorities, err = env.authorities(stderr, o.SignerURI, k.authorities); err != nil {
				return err
			}
			err = env.runOp(stdout, stderr, func(cer *keystore.Ceremony) (*keystore.Outcome, error) {
				d, err := receiptsDir(dir, o.Out.Dir.Path(o.Out.Name))
				if err != nil {
					return nil, err
				}
				out, err := cer.IntermediateRequest(cmd.Context(), d, o)
				if err == nil && attestOut != "" {
					out.Notes = nil // the attested request, not the CSR, goes to the root
				}
				return out, err
			})
			if err != nil || attestOut == "" {
				return err
			}
			return env.attestRequest(cmd.Context(), stdout, stderr, o, attestOut, dir)
		},
	}
	f := c.Flags()
	f.StringVar(&o.SignerURI, "signer", "", "key URI where the node's intermediate key is created (tpm:, pkcs11: or file:)")
	f.StringVar(&o.Name, "name", "", "the intermediate's common name, e.g. the node name")
	f.StringVar(&out, "out", "", "certificate request output file (PEM)")
	f.StringVar(&dir, "dir", "", "ceremony directory of this node, for receipts and interrupted-run records (default: the directory of --out)")
	f.StringVar(&attestOut, "attest", "", "TPM only: also write this attested request (CSR + EK certificate + attestation key + TPM2_CertifyCreation of the key over the CSR's hash) for intermediate sign --ek-roots")
	f.BoolVar(&o.ReuseKey, "reuse-key", false, "make the request for a key that already exists at --signer but was not created by this directory's ceremony")
	k.register(c, "key algorithm: p256, p384, rsa3072 or ed25519 (not on a TPM)",
		"TPM only: bind the key to these sha256 PCRs, e.g. 7,11 (adds pcrs= to the tpm: URI)")
	return c
}

func intermediateSignCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var f issueFlags
	var o keystore.IntermediateSignOptions
	var csrPath string
	var ranges []string
	var e expectFlags
	c := &cobra.Command{
		Use:   "sign --signer ROOT_URI --ca os-ca.crt --csr FILE --out issuer.crt [--hours N] [--permitted-ip-ranges CIDRS] [--ek-roots FILE]",
		Short: "Certify a node's intermediate with the root: CA, path length 0, EKU exactly [ServerAuth]",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.required(map[string]string{"csr": csrPath}); err != nil {
				return err
			}
			if err := e.checkEnrol(); err != nil {
				return err
			}
			var err error
			if o.PermittedIPRanges, err = parseRanges(ranges); err != nil {
				return err
			}
			o.SignerURI, o.Validity, o.Force = f.signer, f.validity, f.force
			if o.CA, err = readCA(f.ca); err != nil {
				return err
			}
			if o.Out, err = outTarget(f.out); err != nil {
				return err
			}
			if e.ekRoots != "" {
				return e.signAttested(cmd, env, stdout, stderr, &f, o, csrPath)
			}
			if o.CSR, _, err = readCSR(csrPath); err != nil {
				return attestedWithoutRoots(csrPath, err)
			}
			o.Rotation = filepath.Base(csrPath) == certdir.FileNextIssuerCSR
			return f.run(cmd, env, stdout, stderr, func(ctx context.Context, cer *keystore.Ceremony, rd keystore.Dir) (*keystore.Outcome, error) {
				_, res, err := cer.IntermediateSign(ctx, rd, o)
				return res, err
			})
		},
	}
	f.register(c, "the root's certificate (os-ca.crt)", "issuer.crt output file (the intermediate; the root stays out)", "replace --out")
	c.Flags().StringVar(&csrPath, "csr", "", "the node's certificate request (intermediate request --out), or with --ek-roots its attested request (--attest)")
	e.register(c)
	e.registerPins(c)
	cli.ListVar(c.Flags(), &ranges, "permitted-ip-ranges", nil, "CIDRs every worker IP SAN must fall in (IP name constraints; cover node addresses, machine.certSANs, 127.0.0.1, KubeSpan)")
	return c
}

// parseRanges parses --permitted-ip-ranges.
func parseRanges(ranges []string) ([]*net.IPNet, error) {
	var out []*net.IPNet
	for _, r := range ranges {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			return nil, cli.Usagef("--permitted-ip-ranges: %q is not a CIDR", r)
		}
		p = p.Masked()
		out = append(out, &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())})
	}
	return out, nil
}

// issuerNextTo is the issuer.crt in the directory of the CA file, for
// status.
func issuerNextTo(caPath string) string {
	return filepath.Join(filepath.Dir(caPath), certdir.FileIssuerChain)
}
