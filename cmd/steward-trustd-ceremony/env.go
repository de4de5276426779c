package main

import (
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/steward-trustd/steward-trustd/cmd/internal/backends"
	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
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
	// tpmDial opens TPMs for the commands that use one outside a key
	// (policy quote, reading PCR values to approve); nil means tpmdev.Dial.
	tpmDial tpm.DialFunc
	// warnings collects the devices' warnings for the closing summary.
	warnings warnSummary
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

// ceremony opens the key registry; device warnings go to stderr.
func (e *environment) ceremony(stderr io.Writer) (*keystore.Ceremony, error) {
	keys, err := e.keys(e.warnings.logger(stderr))
	if err != nil {
		return nil, err
	}
	return &keystore.Ceremony{Keys: keys, Clock: e.clock, Rand: e.rand, Version: version}, nil
}

// runOp runs one ceremony operation and prints its outcome.
func (e *environment) runOp(stdout, stderr io.Writer, op func(*keystore.Ceremony) (*keystore.Outcome, error)) error {
	cer, err := e.ceremony(stderr)
	if err != nil {
		return err
	}
	res, err := op(cer)
	if err != nil {
		return err
	}
	printOutcome(stdout, res)
	return nil
}

func parseAlgorithm(s string) (signer.Algorithm, error) {
	alg, err := signer.ParseAlgorithm(s)
	if err != nil {
		return "", cli.Usage(fmt.Errorf("--algorithm: %w", err))
	}
	return alg, nil
}

// parseRoles checks talosctl roles at the command line, so a typo is a
// usage error before any device is opened.
func parseRoles(roles []string) ([]string, error) {
	parsed, err := pki.ParseRoles(roles)
	if err != nil {
		return nil, cli.Usage(fmt.Errorf("--roles: %w", err))
	}
	return parsed, nil
}

// checkHosts checks IP addresses and DNS names given with flag.
func checkHosts(flag string, hosts []string) error {
	if len(hosts) == 0 {
		return cli.Usagef("required flag(s) --%s not set", flag)
	}
	if _, _, err := pki.SplitHosts(hosts); err != nil {
		return cli.Usage(fmt.Errorf("--%s: %w", flag, err))
	}
	return nil
}

// withPCRs binds a tpm: key URI to the --pcrs selection.
func withPCRs(uri string, pcrs []int) (string, error) {
	out, err := tpm.WithPCRs(uri, pcrs)
	return out, cli.Usage(err)
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

// readCSR reads and verifies a PEM certificate request.
func readCSR(path string) ([]byte, *x509.CertificateRequest, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	csr, err := pki.ParseCSR(data, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return data, csr.CertificateRequest, nil
}

func mkdir(dir string) (keystore.OSDir, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return keystore.OSDir{}, err
	}
	return keystore.OSDir{Root: dir}, nil
}

// createOut creates --out for init and import and returns undo, which
// removes the directories it created if they are still empty: a failed
// operation leaves no empty --out behind, while one that wrote an intent
// record (to be resumed) keeps it, since os.Remove refuses a non-empty
// directory.
func createOut(dir string) (keystore.OSDir, func(), error) {
	var created []string // deepest first
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			break
		}
		created = append(created, p)
		if filepath.Dir(p) == p {
			break
		}
	}
	d, err := mkdir(dir)
	undo := func() {
		for _, p := range created {
			if os.Remove(p) != nil {
				return
			}
		}
	}
	if err != nil {
		undo()
	}
	return d, undo, err
}

// runInOut runs op on a new or existing --out directory; see createOut.
func runInOut(out string, op func(keystore.OSDir) (*keystore.Outcome, error)) (*keystore.Outcome, error) {
	d, undo, err := createOut(out)
	if err != nil {
		return nil, err
	}
	res, err := op(d)
	if err != nil {
		undo()
	}
	return res, err
}

// receiptsDir is --dir, or the directory of the CA file.
func receiptsDir(dir, caPath string) (keystore.OSDir, error) {
	if dir == "" {
		dir = filepath.Dir(caPath)
	}
	return mkdir(dir)
}

// outTarget is the output file --out names, its directory created.
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
