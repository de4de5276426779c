package main

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/backends"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
)

// environment is what commands take from the process, replaceable in
// tests.
type environment struct {
	keys  func(logger *slog.Logger) (keystore.Keys, error)
	clock func() time.Time
	rand  io.Reader
}

func defaultEnvironment() *environment {
	return &environment{
		keys: func(l *slog.Logger) (keystore.Keys, error) {
			r, err := backends.Registry(l)
			if err != nil {
				return nil, err
			}
			return r, nil
		},
		clock: time.Now,
		rand:  rand.Reader,
	}
}

func (e *environment) ceremony(stderr io.Writer) (*keystore.Ceremony, error) {
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	keys, err := e.keys(logger)
	if err != nil {
		return nil, err
	}
	return &keystore.Ceremony{Keys: keys, Clock: e.clock, Rand: e.rand, Version: version}, nil
}

func newRoot(env *environment, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "steward-trustd-ceremony",
		Short: "Create, import and use the Talos OS CA key on a TPM, a PKCS#11 HSM or a file",
		Long: `steward-trustd-ceremony manages the Talos OS CA whose private key lives on a device.
Keys are named by URI: tpm:path=/var/lib/ca.tpmkey;pcrs=7, tpm:handle=0x81000100,
pkcs11:token=ca;object=os-ca?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=/run/pin,
or file:/etc/steward-trustd/certs/os-ca.key.

Exit codes: 0 success, 1 the operation failed, 2 usage error.`,
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown command %q", args[0])
			}
			return usagef("a command is required (init, import, sign-csr, talosconfig, server-cert, rotate, status, doctor)")
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.CompletionOptions.DisableDefaultCmd = true
	for _, c := range []*cobra.Command{
		initCmd(env, stdout, stderr),
		importCmd(env, stdout, stderr),
		signCSRCmd(env, stdout, stderr),
		talosconfigCmd(env, stdout, stderr),
		serverCertCmd(env, stdout, stderr),
		rotateCmd(env, stdout, stderr),
		statusCmd(env, stdout, stderr),
		doctorCmd(stdout),
	} {
		c.Args = noArgs
		c.SilenceUsage = true
		root.AddCommand(c)
	}
	return root
}

func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q", args[0])
	}
	return nil
}

func require(flags map[string]string) error {
	var missing []string
	for name, v := range flags {
		if v == "" {
			missing = append(missing, "--"+name)
		}
	}
	if len(missing) > 0 {
		sortStrings(missing)
		return usagef("required flag(s) %s not set", strings.Join(missing, ", "))
	}
	return nil
}

func parseAlgorithm(s string) (signer.Algorithm, error) {
	alg, err := signer.ParseAlgorithm(s)
	if err != nil {
		return "", usageError{fmt.Errorf("--algorithm: %w", err)}
	}
	return alg, nil
}

func hoursFlag(h int, name string) (time.Duration, error) {
	if h <= 0 {
		return 0, usagef("--%s must be a positive number of hours", name)
	}
	return time.Duration(h) * time.Hour, nil
}

func splitList(vals []string) []string {
	var out []string
	for _, v := range vals {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

// readCA reads a CA certificate file holding exactly one certificate.
func readCA(path string) (*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA certificate: %w", err)
	}
	ca, err := pki.ParseCertificate(data)
	if err != nil {
		return nil, fmt.Errorf("CA certificate %s: %w", path, err)
	}
	return ca, nil
}

func mkdir(dir string) (keystore.OSDir, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return keystore.OSDir{}, err
	}
	return keystore.OSDir{Root: dir}, nil
}

func printOutcome(w io.Writer, o *keystore.Outcome) {
	for _, r := range o.Resumed {
		fmt.Fprintf(w, "resumed: %s\n", r)
	}
	for _, p := range o.Written {
		fmt.Fprintf(w, "wrote %s\n", p)
	}
	if o.Receipt.KeyFingerprint != "" {
		fmt.Fprintf(w, "key: %s %s fingerprint %s (%s)\n", o.Receipt.Backend, o.Receipt.KeyAlgorithm, o.Receipt.KeyFingerprint, o.Receipt.KeyLocation)
	}
	if o.Receipt.CertificateFingerprint != "" {
		fmt.Fprintf(w, "certificate: %s sha256 %s, expires %s\n", o.Receipt.CertificateSubject, o.Receipt.CertificateFingerprint, o.Receipt.CertificateNotAfter.Format(time.RFC3339))
	}
	for _, n := range o.Notes {
		fmt.Fprintf(w, "%s\n", n)
	}
}

func initCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var o keystore.InitOptions
	var out, alg, pcrs string
	var hours int
	c := &cobra.Command{
		Use:   "init --signer URI --cluster NAME --out DIR",
		Short: "Create the OS CA key on the device and self-sign the CA through it",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := require(map[string]string{"signer": o.SignerURI, "cluster": o.Cluster, "out": out}); err != nil {
				return err
			}
			a, err := parseAlgorithm(alg)
			if err != nil {
				return err
			}
			o.Algorithm = a
			if o.Validity, err = hoursFlag(hours, "hours"); err != nil {
				return err
			}
			if pcrs != "" {
				list, err := tpm.ParsePCRs(pcrs)
				if err != nil {
					return usagef("--pcrs: %v", err)
				}
				if o.SignerURI, err = tpm.WithPCRs(o.SignerURI, list); err != nil {
					return usageError{err}
				}
			}
			cer, err := env.ceremony(stderr)
			if err != nil {
				return err
			}
			d, err := mkdir(out)
			if err != nil {
				return err
			}
			res, err := cer.Init(cmd.Context(), d, o)
			if err != nil {
				return err
			}
			printOutcome(stdout, res)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&o.SignerURI, "signer", "", "key URI where the CA key is created (tpm:, pkcs11: or file:)")
	f.StringVar(&o.Cluster, "cluster", "", "cluster name (CA common name, Kubernetes Secret steward-trustd-NAME)")
	f.StringVar(&o.Organization, "organization", "talos", "CA subject organization")
	f.IntVar(&hours, "hours", 87600, "CA validity in hours")
	f.StringVar(&alg, "algorithm", "p256", "key algorithm: p256, p384, rsa3072 or ed25519 (not on a TPM)")
	f.StringVar(&pcrs, "pcrs", "", "TPM only: bind the key to these sha256 PCRs, e.g. 7,11 (adds pcrs= to the tpm: URI)")
	f.StringVar(&out, "out", "", "ceremony directory (os-ca.crt, token, kubernetes-secret.yaml, worker patch, receipts/)")
	f.BoolVar(&o.Force, "force", false, "replace existing output files (device keys are never replaced)")
	return c
}

func importCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var o keystore.ImportOptions
	var keyPath, certPath, secretsPath, out string
	c := &cobra.Command{
		Use:   "import --signer URI (--key os-ca.key --cert os-ca.crt | --talos-secrets secrets.yaml) --out DIR",
		Short: "Move an existing OS CA key onto the device as non-extractable",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := require(map[string]string{"signer": o.SignerURI, "out": out}); err != nil {
				return err
			}
			var src *keystore.ImportSource
			switch {
			case secretsPath != "" && (keyPath != "" || certPath != ""):
				return usagef("give either --talos-secrets or --key and --cert, not both")
			case secretsPath != "":
				data, err := os.ReadFile(secretsPath)
				if err != nil {
					return err
				}
				if src, err = keystore.ParseTalosSecrets(data); err != nil {
					return err
				}
			case keyPath != "" && certPath != "":
				keyPEM, err := os.ReadFile(keyPath)
				if err != nil {
					return err
				}
				certPEM, err := os.ReadFile(certPath)
				if err != nil {
					return err
				}
				if src, err = keystore.ParseImportFiles(keyPEM, certPEM); err != nil {
					return err
				}
			default:
				return usagef("give --key and --cert, or --talos-secrets")
			}
			o.Source = src
			cer, err := env.ceremony(stderr)
			if err != nil {
				return err
			}
			d, err := mkdir(out)
			if err != nil {
				return err
			}
			res, err := cer.Import(cmd.Context(), d, o)
			if err != nil {
				return err
			}
			printOutcome(stdout, res)
			source := keyPath
			if source == "" {
				source = secretsPath
			}
			fmt.Fprintf(stdout, "destroy the source now: shred -u %s\n", source)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&o.SignerURI, "signer", "", "key URI where the CA key is put")
	f.StringVar(&keyPath, "key", "", "CA private key PEM file")
	f.StringVar(&certPath, "cert", "", "CA certificate PEM file")
	f.StringVar(&secretsPath, "talos-secrets", "", "secrets.yaml from `talosctl gen secrets` (uses certs.os and trustdinfo.token)")
	f.StringVar(&o.Cluster, "cluster", "", "cluster name for the Kubernetes Secret (default: the CA's common name, or talos)")
	f.StringVar(&out, "out", "", "ceremony directory")
	f.BoolVar(&o.Force, "force", false, "replace existing output files (device keys are never replaced)")
	return c
}

// receiptsDir is --dir, or the directory of the CA file.
// runIssue runs one issuing operation of the ceremony, with its receipt
// in the directory --dir names (default: the directory of --ca), and
// prints the outcome.
func (e *environment) runIssue(stdout, stderr io.Writer, dir, caPath string, op func(*keystore.Ceremony, keystore.Dir) (*keystore.Outcome, error)) error {
	rd, err := receiptsDir(dir, caPath)
	if err != nil {
		return err
	}
	cer, err := e.ceremony(stderr)
	if err != nil {
		return err
	}
	res, err := op(cer, rd)
	if err != nil {
		return err
	}
	printOutcome(stdout, res)
	return nil
}

func receiptsDir(dir, caPath string) (keystore.OSDir, error) {
	if dir == "" {
		dir = filepath.Dir(caPath)
	}
	return mkdir(dir)
}

func outTarget(path string) (keystore.Target, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return keystore.Target{}, err
	}
	d, err := mkdir(filepath.Dir(abs))
	if err != nil {
		return keystore.Target{}, err
	}
	return keystore.Target{Dir: d, Name: filepath.Base(abs)}, nil
}

func signCSRCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var o keystore.SignCSROptions
	var caPath, csrPath, out, dir string
	var roles []string
	var hours int
	c := &cobra.Command{
		Use:   "sign-csr --signer URI --ca os-ca.crt --csr user.csr --roles os:admin --out user.crt",
		Short: "Sign a talosctl client certificate request",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := require(map[string]string{"signer": o.SignerURI, "ca": caPath, "csr": csrPath, "out": out}); err != nil {
				return err
			}
			o.Roles = splitList(roles)
			if _, err := pki.ParseRoles(o.Roles); err != nil {
				return usageError{fmt.Errorf("--roles: %w", err)}
			}
			var err error
			if o.Validity, err = hoursFlag(hours, "hours"); err != nil {
				return err
			}
			if o.CA, err = readCA(caPath); err != nil {
				return err
			}
			if o.CSR, err = os.ReadFile(csrPath); err != nil {
				return err
			}
			if o.Out, err = outTarget(out); err != nil {
				return err
			}
			return env.runIssue(stdout, stderr, dir, caPath, func(cer *keystore.Ceremony, rd keystore.Dir) (*keystore.Outcome, error) {
				_, res, err := cer.SignCSR(cmd.Context(), rd, o)
				return res, err
			})
		},
	}
	f := c.Flags()
	f.StringVar(&o.SignerURI, "signer", "", "CA key URI")
	f.StringVar(&caPath, "ca", "", "CA certificate (os-ca.crt)")
	f.StringVar(&csrPath, "csr", "", "PEM certificate request")
	f.StringSliceVar(&roles, "roles", []string{"os:admin"}, "roles (Organization): "+strings.Join(pki.KnownRoles(), ", "))
	f.IntVar(&hours, "hours", 8760, "validity in hours")
	f.StringVar(&out, "out", "", "certificate output file")
	f.StringVar(&dir, "dir", "", "ceremony directory for the receipt (default: the directory of --ca)")
	f.BoolVar(&o.Force, "force", false, "replace --out")
	return c
}

func talosconfigCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var o keystore.TalosconfigOptions
	var caPath, out, dir string
	var roles, endpoints, nodes []string
	var hours int
	c := &cobra.Command{
		Use:   "talosconfig --signer URI --ca os-ca.crt --context NAME --endpoints IP[,..] --out FILE",
		Short: "Generate a client key and write a talosconfig signed by the device",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := require(map[string]string{"signer": o.SignerURI, "ca": caPath, "context": o.Context, "out": out}); err != nil {
				return err
			}
			o.Endpoints, o.Nodes, o.Roles = splitList(endpoints), splitList(nodes), splitList(roles)
			if len(o.Endpoints) == 0 {
				return usagef("required flag(s) --endpoints not set")
			}
			if _, _, err := pki.SplitHosts(o.Endpoints); err != nil {
				return usageError{fmt.Errorf("--endpoints: %w", err)}
			}
			if _, err := pki.ParseRoles(o.Roles); err != nil {
				return usageError{fmt.Errorf("--roles: %w", err)}
			}
			var err error
			if o.Validity, err = hoursFlag(hours, "hours"); err != nil {
				return err
			}
			if o.CA, err = readCA(caPath); err != nil {
				return err
			}
			if o.Trust, err = certdir.ClientTrust(o.CA, certdir.OSDir(filepath.Dir(caPath))); err != nil {
				return err
			}
			if o.Out, err = outTarget(out); err != nil {
				return err
			}
			return env.runIssue(stdout, stderr, dir, caPath, func(cer *keystore.Ceremony, rd keystore.Dir) (*keystore.Outcome, error) {
				return cer.Talosconfig(cmd.Context(), rd, o)
			})
		},
	}
	f := c.Flags()
	f.StringVar(&o.SignerURI, "signer", "", "CA key URI")
	f.StringVar(&caPath, "ca", "", "CA certificate that signs the client certificate (os-ca.crt, or os-ca.next.crt during a rotation)")
	f.StringVar(&o.Context, "context", "", "talosconfig context name")
	f.StringSliceVar(&endpoints, "endpoints", nil, "Talos API endpoints (IPs or names)")
	f.StringSliceVar(&nodes, "nodes", nil, "default nodes (default: the endpoints)")
	f.StringSliceVar(&roles, "roles", []string{"os:admin"}, "roles: "+strings.Join(pki.KnownRoles(), ", "))
	f.StringVar(&o.CommonName, "name", "talosctl", "client certificate common name")
	f.IntVar(&hours, "hours", 8760, "validity in hours")
	f.StringVar(&out, "out", "", "talosconfig output file (mode 0600)")
	f.StringVar(&dir, "dir", "", "ceremony directory for the receipt (default: the directory of --ca)")
	f.BoolVar(&o.Force, "force", false, "replace --out")
	return c
}

func serverCertCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var o keystore.ServerCertOptions
	var caPath, out, dir string
	var sans []string
	var hours int
	c := &cobra.Command{
		Use:   "server-cert --signer URI --ca os-ca.crt --san IP|DNS[,..] --out DIR",
		Short: "Issue trustd's TLS serving certificate for the addresses workers dial",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := require(map[string]string{"signer": o.SignerURI, "ca": caPath, "out": out}); err != nil {
				return err
			}
			o.Hosts = splitList(sans)
			if len(o.Hosts) == 0 {
				return usagef("required flag(s) --san not set")
			}
			if _, _, err := pki.SplitHosts(o.Hosts); err != nil {
				return usageError{fmt.Errorf("--san: %w", err)}
			}
			var err error
			if o.Validity, err = hoursFlag(hours, "hours"); err != nil {
				return err
			}
			if o.CA, err = readCA(caPath); err != nil {
				return err
			}
			if o.Out, err = mkdir(out); err != nil {
				return err
			}
			return env.runIssue(stdout, stderr, dir, caPath, func(cer *keystore.Ceremony, rd keystore.Dir) (*keystore.Outcome, error) {
				_, res, err := cer.ServerCert(cmd.Context(), rd, o)
				return res, err
			})
		},
	}
	f := c.Flags()
	f.StringVar(&o.SignerURI, "signer", "", "CA key URI")
	f.StringVar(&caPath, "ca", "", "CA certificate (os-ca.crt)")
	f.StringSliceVar(&sans, "san", nil, "IP addresses and DNS names workers dial (every control-plane endpoint address, and its hostname)")
	f.IntVar(&hours, "hours", 8760, "validity in hours")
	f.StringVar(&out, "out", "", "directory for server.crt and server.key")
	f.StringVar(&dir, "dir", "", "ceremony directory for the receipt (default: the directory of --ca)")
	f.BoolVar(&o.Force, "force", false, "replace server.crt and server.key")
	return c
}

func rotateCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var newSigner, alg, out, pcrs string
	var finish bool
	var hours int
	c := &cobra.Command{
		Use:   "rotate --new-signer URI --out DIR [--finish]",
		Short: "Start a CA rotation (new key, both CAs accepted), or finish it with --finish",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := require(map[string]string{"new-signer": newSigner, "out": out}); err != nil {
				return err
			}
			cer, err := env.ceremony(stderr)
			if err != nil {
				return err
			}
			d := keystore.OSDir{Root: out}
			if finish {
				if cmd.Flags().Changed("algorithm") || cmd.Flags().Changed("pcrs") {
					return usagef("--algorithm and --pcrs apply to starting a rotation, not to --finish")
				}
				res, err := cer.RotateFinish(cmd.Context(), d, keystore.RotateFinishOptions{NewSignerURI: newSigner})
				if err != nil {
					return err
				}
				printOutcome(stdout, res)
				return nil
			}
			a, err := parseAlgorithm(alg)
			if err != nil {
				return err
			}
			validity, err := hoursFlag(hours, "hours")
			if err != nil {
				return err
			}
			if pcrs != "" {
				list, err := tpm.ParsePCRs(pcrs)
				if err != nil {
					return usagef("--pcrs: %v", err)
				}
				if newSigner, err = tpm.WithPCRs(newSigner, list); err != nil {
					return usageError{err}
				}
			}
			res, err := cer.Rotate(cmd.Context(), d, keystore.RotateOptions{NewSignerURI: newSigner, Algorithm: a, Validity: validity})
			if err != nil {
				return err
			}
			printOutcome(stdout, res)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&newSigner, "new-signer", "", "key URI of the new CA key (created at start, used at --finish)")
	f.BoolVar(&finish, "finish", false, "finish the rotation: the new CA becomes os-ca.crt, the old one is dropped")
	f.StringVar(&alg, "algorithm", "p256", "new key algorithm")
	f.StringVar(&pcrs, "pcrs", "", "TPM only: PCRs to bind the new key to")
	f.IntVar(&hours, "hours", 87600, "new CA validity in hours")
	f.StringVar(&out, "out", "", "ceremony directory (holds os-ca.crt and token)")
	return c
}

func statusCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var uri, caPath, dir, output string
	c := &cobra.Command{
		Use:   "status --signer URI [--ca os-ca.crt] [--dir DIR] [--output text|json]",
		Short: "Describe the CA key, its policy, the CA certificate and the receipts",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := require(map[string]string{"signer": uri}); err != nil {
				return err
			}
			if output != "text" && output != "json" {
				return usagef("--output must be text or json")
			}
			var ca *x509.Certificate
			if caPath != "" {
				var err error
				if ca, err = readCA(caPath); err != nil {
					return err
				}
				if dir == "" {
					dir = filepath.Dir(caPath)
				}
			}
			var d keystore.Dir
			if dir != "" {
				d = keystore.OSDir{Root: dir}
			}
			cer, err := env.ceremony(stderr)
			if err != nil {
				return err
			}
			st, err := cer.Status(cmd.Context(), uri, ca, d)
			if err != nil {
				return err
			}
			if output == "json" {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			printStatus(stdout, st)
			if st.CA != nil && !st.CA.KeyMatches {
				return errors.New("the key does not match the CA certificate")
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&uri, "signer", "", "CA key URI")
	f.StringVar(&caPath, "ca", "", "CA certificate to check against the key")
	f.StringVar(&dir, "dir", "", "ceremony directory whose receipts to list (default: the directory of --ca)")
	f.StringVarP(&output, "output", "o", "text", "text or json")
	return c
}

func printStatus(w io.Writer, st *keystore.Status) {
	k := st.Key
	fmt.Fprintf(w, "backend:      %s\n", k.Backend)
	fmt.Fprintf(w, "location:     %s\n", k.Location)
	fmt.Fprintf(w, "algorithm:    %s\n", k.Algorithm)
	fmt.Fprintf(w, "fingerprint:  %s\n", k.Fingerprint)
	fmt.Fprintf(w, "extractable:  %t\n", k.Extractable)
	if k.Policy != "" {
		fmt.Fprintf(w, "policy:       %s\n", k.Policy)
	}
	if k.PolicyDigest != "" {
		fmt.Fprintf(w, "policyDigest: %s\n", k.PolicyDigest)
	}
	if st.PolicyChecked {
		if st.PolicySatisfied {
			fmt.Fprintf(w, "policy check: satisfied by the current PCR values\n")
		} else {
			fmt.Fprintf(w, "policy check: NOT satisfied: %s\n", st.PolicyError)
		}
	}
	if ca := st.CA; ca != nil {
		fmt.Fprintf(w, "CA subject:   %s\n", ca.Subject)
		fmt.Fprintf(w, "CA sha256:    %s\n", ca.Fingerprint)
		fmt.Fprintf(w, "CA valid:     %s to %s", ca.NotBefore.Format(time.RFC3339), ca.NotAfter.Format(time.RFC3339))
		if ca.Expired {
			fmt.Fprintf(w, " (NOT VALID NOW)")
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "key matches:  %t\n", ca.KeyMatches)
	}
	if st.ReceiptsError != "" {
		fmt.Fprintf(w, "receipts:     unreadable: %s\n", st.ReceiptsError)
	}
	fmt.Fprintf(w, "receipts:     %d\n", len(st.Receipts))
	for _, r := range st.Receipts {
		fmt.Fprintf(w, "  %s  %-13s key %.16s", r.Time.Format(time.RFC3339), r.Operation, r.KeyFingerprint)
		if r.CertificateFingerprint != "" {
			fmt.Fprintf(w, "  cert %.16s %s", r.CertificateFingerprint, r.CertificateSubject)
		}
		fmt.Fprintln(w)
	}
}
