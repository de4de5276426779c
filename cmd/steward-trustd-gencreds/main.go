// Command steward-trustd-gencreds writes a complete, file-backed credential
// set for steward-trustd (development, CI and `make run-local`):
//
//	steward-trustd-gencreds -cluster NAME -output DIR [-san IP|DNS ...] [-algorithm p256|ed25519] [-force]
//
// It writes os-ca.crt, os-ca.key, server.crt, server.key, token and
// kubernetes-secret.yaml into DIR, all mode 0600, and refuses to replace
// any of them without -force. For a CA key that never leaves a TPM or an
// HSM use steward-trustd-ceremony instead. Flags take one dash or two.
//
// Exit codes: 0 success, 1 the operation failed, 2 usage error.
package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/harden"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// Before anything reads a token, a PIN or a key.
	harden.AtStart(os.Stderr, "steward-trustd-gencreds")
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the command line of gencreds.
type options struct {
	cluster, output, algorithm string
	sans                       []string
	force                      bool
}

// run is main without the process.
func run(args []string, stdout, stderr io.Writer) int {
	var o options
	root := &cobra.Command{
		Use:   "steward-trustd-gencreds -cluster NAME -output DIR [-san IP|DNS ...] [-algorithm p256|ed25519] [-force]",
		Short: "Write a file-backed OS CA, a trustd serving certificate, a worker token and a Kubernetes Secret manifest",
		Long: `steward-trustd-gencreds writes os-ca.crt, os-ca.key, server.crt, server.key, token and
kubernetes-secret.yaml into DIR (mode 0600) for development, CI and make run-local.
The CA key is a file: for a key on a TPM or an HSM use steward-trustd-ceremony.
Flags take one dash or two (-cluster NAME, --cluster NAME).
Exit codes: 0 success, 1 the operation failed, 2 usage error.`,
		RunE:                  func(*cobra.Command, []string) error { return o.generate(stdout) },
		DisableFlagsInUseLine: true,
	}
	f := root.Flags()
	f.StringVar(&o.cluster, "cluster", "", "cluster name (CA common name and Kubernetes Secret steward-trustd-NAME); required")
	f.StringVar(&o.output, "output", "", "directory to write the credentials into (created 0700 if missing); required")
	f.StringVar(&o.algorithm, "algorithm", string(signer.ECDSAP256), "OS CA key algorithm: p256 or ed25519")
	f.BoolVar(&o.force, "force", false, "replace existing files")
	cli.ListVar(f, &o.sans, "san", nil, "IP address or DNS name for the serving certificate; repeat or comma-separate (default 127.0.0.1 and localhost)")
	cli.Setup(root, version)
	return cli.Run(context.Background(), root, args, stdout, stderr)
}

// check validates the command line; every error is a usage error.
func (o options) check() (signer.Algorithm, error) {
	if err := cli.Required(map[string]string{"cluster": o.cluster, "output": o.output}); err != nil {
		return "", err
	}
	alg, err := signer.ParseAlgorithm(o.algorithm)
	if err != nil || (alg != signer.ECDSAP256 && alg != signer.Ed25519) {
		return "", cli.Usagef("--algorithm %q: want p256 or ed25519", o.algorithm)
	}
	if _, _, err := pki.SplitHosts(o.sans); err != nil {
		return "", cli.Usage(fmt.Errorf("--san: %w", err))
	}
	return alg, nil
}

// generate writes the credential set, all or nothing.
func (o options) generate(stdout io.Writer) error {
	alg, err := o.check()
	if err != nil {
		return err
	}
	files, err := keystore.GenerateCredentials(keystore.CredentialsOptions{
		Cluster: o.cluster, Hosts: o.sans, Algorithm: alg, Now: time.Now(), Rand: rand.Reader,
	})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.output, 0o700); err != nil {
		return err
	}
	dir := keystore.OSDir{Root: o.output}
	if err := keystore.WriteSet(dir, files, o.force); err != nil {
		return err
	}
	for _, f := range files {
		fmt.Fprintf(stdout, "wrote %s\n", dir.Path(f.Name))
	}
	fmt.Fprintf(stdout, "the OS CA key is a file (%s): use it for development only; see steward-trustd-ceremony for TPM and HSM keys\n",
		dir.Path(certdir.FileCAKey))
	return nil
}
