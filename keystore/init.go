package keystore

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// InitOptions configures Init.
type InitOptions struct {
	// SignerURI is where the new key is created (tpm:, pkcs11: or file:).
	SignerURI string
	// Cluster names the CA (CommonName) and the Kubernetes Secret.
	Cluster string
	// Organization is the CA subject's O; empty means "talos".
	Organization string
	// Validity of the CA; zero means pki.DefaultCAValidity.
	Validity time.Duration
	// Algorithm of the new key; empty means signer.ECDSAP256.
	Algorithm signer.Algorithm
	// Force allows replacing existing output files (never device keys).
	Force bool
}

// Init creates the OS CA key on the device, self-signs the CA certificate
// through it (the signature is verified) and writes os-ca.crt, token,
// kubernetes-secret.yaml (no private key) and the worker machine-config
// patch into d, with a receipt.
//
// A re-run after an interrupted Init resumes: the key is recognised by the
// "init.key" receipt written right after its creation, an os-ca.crt of
// that key is kept, as is its token; a complete earlier run is reported
// as AlreadyDone and nothing is written.
func (c *Ceremony) Init(ctx context.Context, d Dir, o InitOptions) (*Outcome, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if o.Cluster == "" {
		return nil, errors.New("init: a cluster name is required")
	}
	if o.Validity < 0 {
		return nil, errors.New("init: validity must be positive")
	}
	if o.Algorithm == "" {
		o.Algorithm = signer.ECDSAP256
	}
	out := &Outcome{}
	caData, err := readOptional(d, certdir.FileCACert)
	if err != nil {
		return nil, err
	}
	if !o.Force {
		if err := c.initPrecheck(ctx, d, o.SignerURI); err != nil {
			return nil, err
		}
	}
	key, resumedKey, err := c.generateOrResume(ctx, d, o.SignerURI, o.Algorithm, "init.key")
	if err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	defer key.Close()
	desc := key.Describe()
	if resumedKey {
		out.Resumed = append(out.Resumed, fmt.Sprintf("key %s was created by an earlier run (%s)", desc.Fingerprint, desc.Location))
	}

	var ca *x509.Certificate
	if caData != nil {
		existing, perr := pki.ParseCertificate(caData)
		switch {
		case perr == nil && pki.KeyMatchesCert(key.Public(), existing):
			ca = existing
			out.Resumed = append(out.Resumed, d.Path(certdir.FileCACert)+" was already issued for this key")
		case !o.Force && !resumedKey:
			return nil, fmt.Errorf("init: %w: %s holds another CA", ErrExists, d.Path(certdir.FileCACert))
		case !o.Force:
			return nil, fmt.Errorf("init: %w: %s holds a CA that is not the key's; remove it or pass --force", ErrExists, d.Path(certdir.FileCACert))
		}
	}
	if ca == nil {
		ca, err = pki.NewCACertificate(key, pki.CAOptions{Cluster: o.Cluster, Organization: o.Organization, Validity: o.Validity}, c.now(), c.Rand)
		if err != nil {
			return nil, fmt.Errorf("init: self-sign the CA through the device: %w", err)
		}
	}
	resuming := resumedKey || len(out.Resumed) > 0

	token := ""
	if resuming {
		t, err := readOptional(d, certdir.FileToken)
		if err != nil {
			return nil, err
		}
		if tt := strings.TrimSpace(string(t)); tt != "" {
			token = tt
			out.Resumed = append(out.Resumed, d.Path(certdir.FileToken)+" kept")
		}
	}
	if token == "" {
		if token, err = certdir.NewToken(c.Rand); err != nil {
			return nil, err
		}
	}
	files, err := clusterFiles(o.Cluster, ca, nil, token, nil)
	if err != nil {
		return nil, err
	}
	if resuming && !o.Force {
		done, err := c.initComplete(d, files, desc.Fingerprint)
		if err != nil {
			return nil, err
		}
		if done {
			out.AlreadyDone = true
			out.Notes = append(out.Notes, "init had already completed for this key; nothing was written")
			return out, nil
		}
	}
	r := newReceipt("init", c.Version, c.now(), desc)
	certReceipt(&r, ca)
	r.Files = fileNames(files)
	rf, err := receiptFile(d, r, c.Rand)
	if err != nil {
		return nil, err
	}
	// A resumed run rewrites the files it derived from the same CA and
	// token; a fresh one refuses to replace anything without --force.
	if !o.Force && !resuming {
		if err := CheckAbsent(d, files); err != nil {
			return nil, fmt.Errorf("init: %w (the key was created and is recorded; re-run with the same flags to resume)", err)
		}
	}
	if err := WriteSet(d, append(files, rf), true); err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	out.Receipt = r
	out.Written = paths(d, append(files, rf))
	out.Notes = append(out.Notes,
		"apply "+d.Path(certdir.FileWorkerPatch)+" to every worker's machine config (it holds the token: keep it secret)",
		"deploy "+d.Path(certdir.FileKubernetesSecret)+" and run steward-trustd with TRUSTD_SIGNER set to the signer URI")
	return out, nil
}

// initComplete reports whether every output of init is present with the
// content it would have and an "init" receipt exists for the key.
func (c *Ceremony) initComplete(d Dir, files []File, fp string) (bool, error) {
	for _, f := range files {
		if f.Remove {
			ok, err := d.Exists(f.Name)
			if err != nil || ok {
				return false, err
			}
			continue
		}
		got, err := d.ReadFile(f.Name)
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if string(got) != string(f.Data) {
			return false, nil
		}
	}
	rc, err := findReceipt(d, "init", fp)
	return rc != nil, err
}

func fileNames(files []File) []string {
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = f.Name
		if f.Remove {
			out[i] = "-" + f.Name
		}
	}
	return out
}

// initOutputs are the files init writes besides its receipt.
var initOutputs = []string{certdir.FileCACert, certdir.FileToken, certdir.FileWorkerPatch, certdir.FileKubernetesSecret}

// initPrecheck refuses, before any key is created, a directory that
// already holds init outputs unless they belong to an earlier run of init
// for the key at uri (which is then resumed).
func (c *Ceremony) initPrecheck(ctx context.Context, d Dir, uri string) error {
	var present []File
	for _, n := range initOutputs {
		present = append(present, File{Name: n})
	}
	absentErr := CheckAbsent(d, present)
	if absentErr == nil {
		return nil
	}
	s, err := c.Keys.Open(ctx, uri)
	if err != nil {
		return fmt.Errorf("init: %w", absentErr)
	}
	defer s.Close()
	rc, err := findReceipt(d, "init.key", s.Describe().Fingerprint)
	if err != nil {
		return err
	}
	if rc == nil {
		return fmt.Errorf("init: %w", absentErr)
	}
	return nil
}
