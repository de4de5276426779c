package main

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/keystore"
)

// statusFlags are the flags of status.
type statusFlags struct {
	signer, ca, issuer, dir, output string
}

// chain reads --issuer, or issuer.crt next to --ca when present.
func (f statusFlags) chain() ([]*x509.Certificate, error) {
	path := f.issuer
	if path == "" && f.ca != "" {
		if _, err := os.Stat(issuerNextTo(f.ca)); err == nil {
			path = issuerNextTo(f.ca)
		}
	}
	if path == "" {
		return nil, nil
	}
	return readCerts(path, "issuer chain")
}

// readCerts reads a PEM certificate file; what names it in errors.
func readCerts(path, what string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	certs, err := pki.ParseCertificates(data)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	return certs, nil
}

// accepted reads accepted-cas.crt next to --ca when present and keeps
// the CAs its trust statement vouches for, as the daemon does (it serves
// and verifies issuer.crt to os-ca.crt and those alone); the others are
// named on stderr.
func (f statusFlags) accepted(stderr io.Writer) ([]*x509.Certificate, error) {
	if f.ca == "" {
		return nil, nil
	}
	dir := filepath.Dir(f.ca)
	path := filepath.Join(dir, certdir.FileAcceptedCAs)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	caPEM, err := os.ReadFile(f.ca)
	if err != nil {
		return nil, fmt.Errorf("read CA certificate: %w", err)
	}
	acceptedPEM, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read accepted CAs: %w", err)
	}
	statement, err := os.ReadFile(filepath.Join(dir, certdir.FileTrustStatement))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read the trust statement: %w", err)
	}
	t, err := certdir.ParseTrust(caPEM, acceptedPEM, statement)
	if err != nil {
		return nil, err
	}
	warnUnvouched(stderr, t)
	return t.Bundle[1:], nil
}

// warnUnvouched names the accepted CAs the daemon would not serve.
func warnUnvouched(stderr io.Writer, t *certdir.Trust) {
	if t.StatementErr != nil {
		fmt.Fprintf(stderr, "warning: %v\n", t.StatementErr)
	}
	for _, c := range t.Unvouched {
		fmt.Fprintf(stderr, "warning: %s holds CA %s (%s) that the root does not vouch for: the daemon does not serve it; vouch with `trust add` or remove it\n", certdir.FileAcceptedCAs, pki.CertFingerprint(c), c.Subject)
	}
}

// inputs reads --ca and the receipts directory (--dir, default the
// directory of --ca; nil when neither is given).
func (f statusFlags) inputs() (*x509.Certificate, keystore.Dir, error) {
	var ca *x509.Certificate
	dir := f.dir
	if f.ca != "" {
		var err error
		if ca, err = readCA(f.ca); err != nil {
			return nil, nil, err
		}
		if dir == "" {
			dir = filepath.Dir(f.ca)
		}
	}
	if dir == "" {
		return ca, nil, nil
	}
	return ca, keystore.OSDir{Root: dir}, nil
}

func statusCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var f statusFlags
	c := &cobra.Command{
		Use:   "status --signer URI [--ca os-ca.crt] [--issuer issuer.crt] [--dir DIR] [--output text|json]",
		Short: "Describe the CA key, its policy, the CA certificate, the issuer chain and the receipts",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Required(map[string]string{"signer": f.signer}); err != nil {
				return err
			}
			if err := checkOutput(f.output); err != nil {
				return err
			}
			ca, d, err := f.inputs()
			if err != nil {
				return err
			}
			chain, err := f.chain()
			if err != nil {
				return err
			}
			cer, err := env.ceremony(stderr)
			if err != nil {
				return err
			}
			accepted, err := f.accepted(stderr)
			if err != nil {
				return err
			}
			st, err := cer.StatusAccepting(cmd.Context(), f.signer, ca, accepted, d, chain...)
			if err != nil {
				return err
			}
			return reportStatus(stdout, f.output, st)
		},
	}
	fs := c.Flags()
	fs.StringVar(&f.signer, "signer", "", "CA key URI")
	fs.StringVar(&f.ca, "ca", "", "CA certificate to check against the key (the root, in the tiered setup); accepted-cas.crt next to it counts as the daemon counts it")
	fs.StringVar(&f.issuer, "issuer", "", "tiered setup: the node's issuer.crt to check against the key and --ca (default: issuer.crt next to --ca, if present)")
	fs.StringVar(&f.dir, "dir", "", "ceremony directory whose receipts to list (default: the directory of --ca)")
	fs.StringVarP(&f.output, "output", "o", "text", "text or json")
	return c
}

// reportStatus prints st and then fails (exit 1) if the key cannot sign
// as deployed: the daemon would refuse the issuer chain, the key is not
// its certificate's, or the TPM policy is not satisfied now — so that a
// script or a health check can rely on the exit status in both formats.
func reportStatus(w io.Writer, output string, st *keystore.Status) error {
	if output == "json" {
		if err := writeJSON(w, st); err != nil {
			return err
		}
	} else {
		printStatus(w, st)
	}
	return statusProblem(st)
}

// statusProblem is the first reason st's key cannot sign as deployed.
func statusProblem(st *keystore.Status) error {
	switch {
	case st.ChainError != "":
		return errors.New("the daemon would refuse the issuer chain: " + st.ChainError)
	case len(st.Chain) > 0 && !st.KeyMatches():
		return errors.New("the key does not match the issuer chain's first certificate")
	case len(st.Chain) == 0 && st.CA != nil && !st.KeyMatches():
		return errors.New("the key does not match the CA certificate")
	case st.PolicyChecked && !st.PolicySatisfied:
		return errors.New("the key's TPM policy is not satisfied now, so it cannot sign: " + st.PolicyError)
	}
	return nil
}
