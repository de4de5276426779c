// Command steward-trustd-gencreds writes a complete, file-backed credential
// set for steward-trustd (development, CI and `make run-local`):
//
//	steward-trustd-gencreds -cluster NAME -output DIR [-san IP|DNS ...] [-algorithm p256|ed25519] [-force]
//
// It writes os-ca.crt, os-ca.key, server.crt, server.key, token and
// kubernetes-secret.yaml into DIR, all mode 0600, and refuses to replace
// any of them without -force. For a CA key that never leaves a TPM or an
// HSM use steward-trustd-ceremony instead.
//
// Exit codes: 0 success, 1 the operation failed, 2 usage error.
package main

import (
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer"
)

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the process: the standard flag package accepts both
// -cluster and --cluster, which is what the README documents.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("steward-trustd-gencreds", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cluster := fs.String("cluster", "", "cluster name (CA common name and Kubernetes Secret steward-trustd-NAME); required")
	output := fs.String("output", "", "directory to write the credentials into (created 0700 if missing); required")
	algorithm := fs.String("algorithm", string(signer.ECDSAP256), "OS CA key algorithm: p256 or ed25519")
	force := fs.Bool("force", false, "replace existing files")
	var sans []string
	fs.Func("san", "IP address or DNS name for the serving certificate; repeat or comma-separate (default 127.0.0.1 and localhost)", func(v string) error {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				sans = append(sans, s)
			}
		}
		return nil
	})
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: steward-trustd-gencreds -cluster NAME -output DIR [-san IP|DNS ...] [-algorithm p256|ed25519] [-force]\n\n"+
			"Writes a file-backed OS CA, a trustd serving certificate, a worker token and a Kubernetes Secret manifest.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	usage := func(msg string) int {
		fmt.Fprintf(stderr, "steward-trustd-gencreds: %s\n", msg)
		fs.Usage()
		return exitUsage
	}
	if fs.NArg() > 0 {
		return usage(fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
	}
	if *cluster == "" {
		return usage("-cluster is required")
	}
	if *output == "" {
		return usage("-output is required")
	}
	alg, err := signer.ParseAlgorithm(*algorithm)
	if err != nil || (alg != signer.ECDSAP256 && alg != signer.Ed25519) {
		return usage(fmt.Sprintf("-algorithm %q: want p256 or ed25519", *algorithm))
	}
	if _, _, err := pki.SplitHosts(sans); err != nil {
		return usage("-san: " + err.Error())
	}

	files, err := keystore.GenerateCredentials(keystore.CredentialsOptions{
		Cluster:   *cluster,
		Hosts:     sans,
		Algorithm: alg,
		Now:       time.Now(),
		Rand:      rand.Reader,
	})
	if err != nil {
		fmt.Fprintf(stderr, "steward-trustd-gencreds: %v\n", err)
		return exitFail
	}
	if err := os.MkdirAll(*output, 0o700); err != nil {
		fmt.Fprintf(stderr, "steward-trustd-gencreds: %v\n", err)
		return exitFail
	}
	if err := keystore.WriteSet(keystore.OSDir{Root: *output}, files, *force); err != nil {
		fmt.Fprintf(stderr, "steward-trustd-gencreds: %v\n", err)
		return exitFail
	}
	for _, f := range files {
		fmt.Fprintf(stdout, "wrote %s\n", keystore.OSDir{Root: *output}.Path(f.Name))
	}
	fmt.Fprintf(stdout, "the OS CA key is a file (%s): use it for development only; see steward-trustd-ceremony for TPM and HSM keys\n",
		keystore.OSDir{Root: *output}.Path(certdir.FileCAKey))
	return exitOK
}
