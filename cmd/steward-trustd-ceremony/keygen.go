package main

// The commands that put a CA key on a device: init, import, rotate.

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer"
)

// keyFlags are the flags of commands that create a key.
type keyFlags struct {
	algorithm   string
	pcrs        []int
	authorities []string
	systemd     bool
	revocable   revocableFlags
}

func (k *keyFlags) register(cmd *cobra.Command, algUsage, pcrsUsage string) {
	cmd.Flags().StringVar(&k.algorithm, "algorithm", "p256", algUsage)
	cli.PCRsVar(cmd.Flags(), &k.pcrs, "pcrs", pcrsUsage)
	cli.ListVar(cmd.Flags(), &k.authorities, "policy-authority", nil, policyAuthorityUsage)
	cmd.Flags().BoolVar(&k.systemd, "systemd-compatible", false, systemdCompatibleUsage)
	k.revocable.register(cmd)
}

// key parses --algorithm and binds uri to --pcrs (tpm: only).
func (k *keyFlags) key(uri string) (string, signer.Algorithm, error) {
	alg, err := parseAlgorithm(k.algorithm)
	if err != nil {
		return "", "", err
	}
	if uri, err = withPCRs(uri, k.pcrs); err != nil {
		return "", "", err
	}
	if k.systemd {
		if uri, err = withSystemd(uri, k.authorities); err != nil {
			return "", "", err
		}
	}
	uri, err = k.revocable.apply(uri, k.authorities, k.systemd)
	return uri, alg, err
}

func initCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var o keystore.InitOptions
	var k keyFlags
	var out string
	c := &cobra.Command{
		Use:   "init --signer URI --cluster NAME --out DIR",
		Short: "Create the OS CA key on the device and self-sign the CA through it",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Required(map[string]string{"signer": o.SignerURI, "cluster": o.Cluster, "out": out}); err != nil {
				return err
			}
			var err error
			if o.SignerURI, o.Algorithm, err = k.key(o.SignerURI); err != nil {
				return err
			}
			if o.Authorities, err = env.authorities(stderr, o.SignerURI, k.authorities); err != nil {
				return err
			}
			return env.runOp(stdout, stderr, func(cer *keystore.Ceremony) (*keystore.Outcome, error) {
				return runInOut(out, func(d keystore.OSDir) (*keystore.Outcome, error) { return cer.Init(cmd.Context(), d, o) })
			})
		},
	}
	f := c.Flags()
	f.StringVar(&o.SignerURI, "signer", "", "key URI where the CA key is created (tpm:, pkcs11: or file:)")
	f.StringVar(&o.Cluster, "cluster", "", "cluster name (CA common name, Kubernetes Secret steward-trustd-NAME)")
	f.StringVar(&o.Organization, "organization", "talos", "CA subject organization")
	cli.HoursVar(f, &o.Validity, "hours", 87600, cli.MaxCAHours, "CA validity in hours")
	k.register(c, "key algorithm: p256, p384, rsa3072 or ed25519 (not on a TPM)",
		"TPM only: bind the key to these sha256 PCRs, e.g. 7,11 (adds pcrs= to the tpm: URI)")
	f.StringVar(&out, "out", "", "ceremony directory (os-ca.crt, token, kubernetes-secret.yaml, worker patch, receipts/)")
	f.BoolVar(&o.Force, "force", false, "replace existing output files (device keys are never replaced)")
	return c
}

// importFlags name the key being imported.
type importFlags struct {
	key, cert, secrets, secretsOut string
	// secretsData is the secrets.yaml as read, for the worker secrets file.
	secretsData []byte
}

// source reads the key and certificate to import.
func (f *importFlags) source() (*keystore.ImportSource, error) {
	switch {
	case f.secrets != "" && (f.key != "" || f.cert != ""):
		return nil, cli.Usagef("give either --talos-secrets or --key and --cert, not both")
	case f.secretsOut != "" && f.secrets == "":
		return nil, cli.Usagef("--talos-secrets-out needs --talos-secrets")
	case f.secrets != "":
		return f.talosSource()
	case f.key != "" && f.cert != "":
		keyPEM, err := os.ReadFile(f.key)
		if err != nil {
			return nil, err
		}
		certPEM, err := os.ReadFile(f.cert)
		if err != nil {
			return nil, err
		}
		return keystore.ParseImportFiles(keyPEM, certPEM)
	default:
		return nil, cli.Usagef("give --key and --cert, or --talos-secrets")
	}
}

// talosSource reads --talos-secrets and settles where its worker secrets
// file goes (never over the source itself).
func (f *importFlags) talosSource() (*keystore.ImportSource, error) {
	if f.secretsOut == "" {
		f.secretsOut = strings.TrimSuffix(f.secrets, filepath.Ext(f.secrets)) + "-for-workers.yaml"
	}
	if filepath.Clean(f.secretsOut) == filepath.Clean(f.secrets) {
		return nil, cli.Usagef("--talos-secrets-out must not be the --talos-secrets file: the original is destroyed after the import")
	}
	var err error
	if f.secretsData, err = os.ReadFile(f.secrets); err != nil {
		return nil, err
	}
	return keystore.ParseTalosSecrets(f.secretsData)
}

// finish writes the worker secrets file after an import from a secrets
// bundle and says what to do with the source: a key file goes; a
// secrets.yaml goes too, since the worker secrets file keeps everything in
// it but the OS CA key (a throwaway pair stands in for it, because
// `talosctl gen config --with-secrets` validates certs.os as a key pair).
func (f *importFlags) finish(env *environment, stdout io.Writer, out string, force bool) error {
	if f.key != "" {
		fmt.Fprintln(stdout, "destroy the source now: shred -u "+f.key)
		return nil
	}
	kept, err := keystore.WriteTalosWorkerSecrets(f.secretsOut, f.secretsData, force, env.clock(), env.rand)
	if err != nil {
		return fmt.Errorf("the key is imported, but the worker secrets file is not written: %w", err)
	}
	verb := "wrote"
	if kept {
		verb = "kept"
	}
	patch := filepath.Join(out, certdir.FileWorkerPatch)
	fmt.Fprintf(stdout, "%s %s: the cluster's secrets without the OS CA key (certs.os is a labelled throwaway pair)\n", verb, f.secretsOut)
	fmt.Fprintf(stdout, "worker configs: talosctl gen config CLUSTER https://ENDPOINT:6443 --with-secrets %s --config-patch-worker @%s --output-types worker\n", f.secretsOut, patch)
	fmt.Fprintf(stdout, "now destroy %s and every copy of it (it holds the OS CA key): shred -u %s\n", f.secrets, f.secrets)
	return nil
}

func importCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var o keystore.ImportOptions
	var src importFlags
	var out string
	var authorities []string
	var systemd bool
	c := &cobra.Command{
		Use:   "import --signer URI (--key os-ca.key --cert os-ca.crt | --talos-secrets secrets.yaml [--talos-secrets-out FILE]) --out DIR",
		Short: "Move an existing OS CA key onto the device as non-extractable",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Required(map[string]string{"signer": o.SignerURI, "out": out}); err != nil {
				return err
			}
			var err error
			if systemd {
				if o.SignerURI, err = withSystemd(o.SignerURI, authorities); err != nil {
					return err
				}
			}
			if o.Source, err = src.source(); err != nil {
				return err
			}
			if o.Authorities, err = env.authorities(stderr, o.SignerURI, authorities); err != nil {
				return err
			}
			err = env.runOp(stdout, stderr, func(cer *keystore.Ceremony) (*keystore.Outcome, error) {
				return runInOut(out, func(d keystore.OSDir) (*keystore.Outcome, error) { return cer.Import(cmd.Context(), d, o) })
			})
			if err != nil {
				return err
			}
			return src.finish(env, stdout, out, o.Force)
		},
	}
	f := c.Flags()
	f.StringVar(&o.SignerURI, "signer", "", "key URI where the CA key is put")
	f.StringVar(&src.key, "key", "", "CA private key PEM file")
	f.StringVar(&src.cert, "cert", "", "CA certificate PEM file")
	f.StringVar(&src.secrets, "talos-secrets", "", "secrets.yaml from `talosctl gen secrets` (uses certs.os and trustdinfo.token)")
	f.StringVar(&src.secretsOut, "talos-secrets-out", "", "where to write the secrets for `talosctl gen config --with-secrets` without the OS CA key (default: SECRETS-for-workers.yaml beside --talos-secrets)")
	f.StringVar(&o.Cluster, "cluster", "", "cluster name for the Kubernetes Secret (default: the CA's common name, or talos)")
	f.StringVar(&out, "out", "", "ceremony directory")
	f.BoolVar(&o.Force, "force", false, "replace existing output files (device keys are never replaced)")
	cli.ListVar(f, &authorities, "policy-authority", nil, policyAuthorityUsage)
	f.BoolVar(&systemd, "systemd-compatible", false, systemdCompatibleUsage)
	return c
}

func rotateCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var o keystore.RotateOptions
	var k keyFlags
	var out, name string
	var finish, intermediate bool
	c := &cobra.Command{
		Use:   "rotate --signer URI --new-signer URI --out DIR [--finish] [--intermediate --name NAME]",
		Short: "Start a CA rotation (new key, both CAs accepted), or finish it with --finish; --intermediate rotates a node's intermediate",
		Long: `Without --intermediate, rotate replaces the OS CA (the root): a new key and CA that workers accept
alongside the old one until --finish. Starting needs --signer, the current root's key: it signs the
trust statement (accepted-cas.statement.json) that vouches for the new CA, without which the daemon
does not serve it. --finish has the new key sign the statement for the CAs still accepted.
With --intermediate, DIR is a node's cert dir (os-ca.crt, issuer.crt): rotate creates the node's new
intermediate key at --new-signer and writes DIR/issuer.next.csr for the root to sign into
DIR/issuer.next.crt; the daemon keeps signing with the old key meanwhile. --finish checks the new
chain as the daemon will and makes it issuer.crt; then restart the daemon on the new key.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Required(map[string]string{"new-signer": o.NewSignerURI, "out": out}); err != nil {
				return err
			}
			d := keystore.OSDir{Root: out}
			if finish {
				return rotateFinish(cmd, env, stdout, stderr, d, o.NewSignerURI, intermediate)
			}
			if err := rootSignerFlag(o.SignerURI, intermediate); err != nil {
				return err
			}
			var err error
			if o.NewSignerURI, o.Algorithm, err = k.key(o.NewSignerURI); err != nil {
				return err
			}
			if o.Authorities, err = env.authorities(stderr, o.NewSignerURI, k.authorities); err != nil {
				return err
			}
			if intermediate {
				return rotateIntermediate(cmd, env, stdout, stderr, d, keystore.IntermediateRequestOptions{SignerURI: o.NewSignerURI, Algorithm: o.Algorithm, Name: name, Authorities: o.Authorities})
			}
			return env.runOp(stdout, stderr, func(cer *keystore.Ceremony) (*keystore.Outcome, error) {
				return cer.Rotate(cmd.Context(), d, o)
			})
		},
	}
	f := c.Flags()
	f.StringVar(&o.SignerURI, "signer", "", "key URI of the current CA (root) key, which vouches for the new CA; required to start a root rotation")
	f.StringVar(&o.NewSignerURI, "new-signer", "", "key URI of the new CA key (created at start, used at --finish)")
	f.BoolVar(&finish, "finish", false, "finish the rotation: the new CA becomes os-ca.crt, the old one is dropped")
	f.BoolVar(&intermediate, "intermediate", false, "rotate this node's intermediate (tiered setup) instead of the root")
	f.StringVar(&name, "name", "", "--intermediate: the new intermediate's common name, e.g. the node name")
	k.register(c, "new key algorithm", "TPM only: PCRs to bind the new key to")
	cli.HoursVar(f, &o.Validity, "hours", 87600, cli.MaxCAHours, "new CA validity in hours")
	f.StringVar(&out, "out", "", "ceremony directory (holds os-ca.crt and token), or with --intermediate the node's cert dir")
	return c
}

// rootSignerFlag checks --signer when a rotation starts: required for the
// root (the current root vouches for the new CA), refused for an
// intermediate.
func rootSignerFlag(uri string, intermediate bool) error {
	switch {
	case intermediate && uri != "":
		return cli.Usagef("--signer applies to a root rotation; an intermediate rotation needs only --new-signer")
	case !intermediate && uri == "":
		return cli.Usagef("required flag(s) --signer not set: the current root's key vouches for the new CA")
	}
	return nil
}

// rotateIntermediate starts an intermediate rotation.
func rotateIntermediate(cmd *cobra.Command, env *environment, stdout, stderr io.Writer, d keystore.Dir, o keystore.IntermediateRequestOptions) error {
	if o.Name == "" {
		return cli.Usagef("required flag(s) --name not set: --intermediate needs the new intermediate's common name")
	}
	if cmd.Flags().Changed("hours") {
		return cli.Usagef("--hours applies to the root; an intermediate's validity is chosen by intermediate sign")
	}
	return env.runOp(stdout, stderr, func(cer *keystore.Ceremony) (*keystore.Outcome, error) {
		return cer.IntermediateRotate(cmd.Context(), d, o)
	})
}

func rotateFinish(cmd *cobra.Command, env *environment, stdout, stderr io.Writer, d keystore.Dir, uri string, intermediate bool) error {
	for _, n := range []string{"algorithm", "pcrs", "hours", "policy-authority", "name"} {
		if cmd.Flags().Changed(n) {
			return cli.Usagef("--%s applies to starting a rotation, not to --finish", n)
		}
	}
	return env.runOp(stdout, stderr, func(cer *keystore.Ceremony) (*keystore.Outcome, error) {
		if intermediate {
			return cer.IntermediateRotateFinish(cmd.Context(), d, uri)
		}
		return cer.RotateFinish(cmd.Context(), d, keystore.RotateFinishOptions{NewSignerURI: uri})
	})
}
