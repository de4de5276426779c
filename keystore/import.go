package keystore

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v4"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/keyutil"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// ImportSource is an existing OS CA to move onto a device.
type ImportSource struct {
	// Key is the CA private key (read from a file; it is the caller's job
	// to have the user destroy that file afterwards).
	Key crypto.Signer
	// Cert is the CA certificate.
	Cert *x509.Certificate
	// Token is the existing worker token (machine.token), if known.
	Token string
}

// ParseImportFiles parses a CA key and certificate PEM pair.
func ParseImportFiles(keyPEM, certPEM []byte) (*ImportSource, error) {
	key, err := keyutil.ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	cert, err := pki.ParseCertificate(certPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	return &ImportSource{Key: key, Cert: cert}, nil
}

// talosSecrets holds the fields of a `talosctl gen secrets` bundle
// (pkg/machinery/config/generate/secrets.Bundle, YAML keys lowercased)
// that the OS CA needs: certs.os.{crt,key} base64 PEM and trustdinfo.token.
type talosSecrets struct {
	Certs struct {
		OS *struct {
			Crt string `yaml:"crt"`
			Key string `yaml:"key"`
		} `yaml:"os"`
	} `yaml:"certs"`
	TrustdInfo struct {
		Token string `yaml:"token"`
	} `yaml:"trustdinfo"`
}

// ParseTalosSecrets extracts the OS CA and the trustd token from a
// secrets.yaml written by `talosctl gen secrets`.
func ParseTalosSecrets(data []byte) (*ImportSource, error) {
	var s talosSecrets
	if err := yaml.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("talos secrets: %w", err)
	}
	if s.Certs.OS == nil || s.Certs.OS.Crt == "" || s.Certs.OS.Key == "" {
		return nil, errors.New("talos secrets: no certs.os.crt/certs.os.key (is this a `talosctl gen secrets` file?)")
	}
	crt, err := base64.StdEncoding.DecodeString(s.Certs.OS.Crt)
	if err != nil {
		return nil, fmt.Errorf("talos secrets: certs.os.crt: %w", err)
	}
	key, err := base64.StdEncoding.DecodeString(s.Certs.OS.Key)
	if err != nil {
		return nil, fmt.Errorf("talos secrets: certs.os.key is not base64")
	}
	src, err := ParseImportFiles(key, crt)
	if err != nil {
		return nil, fmt.Errorf("talos secrets: %w", err)
	}
	if isThrowaway(src.Cert) {
		return nil, errors.New("talos secrets: certs.os is the throwaway pair an earlier import wrote for worker configs, not an OS CA: import from the original secrets.yaml, or use the device key already imported")
	}
	src.Token = strings.TrimSpace(s.TrustdInfo.Token)
	return src, nil
}

// ImportOptions configures Import.
type ImportOptions struct {
	// SignerURI is where the key is put.
	SignerURI string
	// Source is the CA to import.
	Source *ImportSource
	// Cluster names the Kubernetes Secret; empty means the CA's
	// CommonName, or "talos" if it has none (Talos's own OS CA).
	Cluster string
	// Force allows replacing existing output files (never device keys).
	Force bool
	// Authorities, if any, put the key into the TPM under policy
	// authorities.
	Authorities Authorities
}

// Import checks that the certificate matches the key and is a CA, puts the
// key into the device (non-extractable where the backend can enforce it),
// verifies it by signing on the device, and writes the cluster files and
// a receipt into d. The source key file is the caller's to destroy.
//
// An interrupted Import resumes when re-run: the key is known in advance,
// so a key at the signer URI with its fingerprint is the one an earlier
// run put there; any other key there is refused (ForeignKeyError).
func (c *Ceremony) Import(ctx context.Context, d Dir, o ImportOptions) (_ *Outcome, err error) {
	fp, err := o.check()
	if err != nil {
		return nil, err
	}
	st, unlock, err := c.begin(d)
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	defer unlock()
	if err := importTargetFree(st, o); err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	s, resumed, err := c.importKey(ctx, st, o, fp)
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	defer closeKey(s, &err)
	if err := VerifyDeviceSignature(s, o.Source.Cert.PublicKey, c.Rand); err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	token, err := certdir.NewToken(c.Rand)
	if err != nil {
		return nil, err
	}
	p, err := planImport(st, o, importResults{key: s.Describe(), keyResumed: resumed, newToken: token})
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	return c.commit(st, p)
}

// check validates the source and returns its key's fingerprint.
func (o *ImportOptions) check() (string, error) {
	src := o.Source
	if src == nil || src.Key == nil || src.Cert == nil {
		return "", errors.New("import: a CA key and certificate are required")
	}
	if !pki.KeyMatchesCert(src.Key.Public(), src.Cert) {
		return "", fmt.Errorf("import: %w: the certificate's public key is not the key's, they are not a pair", ErrKeyMismatch)
	}
	if err := pki.CheckCA(src.Cert); err != nil {
		return "", fmt.Errorf("import: %w", err)
	}
	return signer.Fingerprint(src.Key.Public())
}

// importTargetFree refuses, before the device is touched, a directory
// holding another CA's files unless --force.
func importTargetFree(st *state, o ImportOptions) error {
	switch {
	case o.Force || (st.ca != nil && st.ca.Equal(o.Source.Cert)):
		return nil
	case st.ca != nil || st.caErr != nil:
		return fmt.Errorf("%w: %s holds another CA", ErrExists, st.dir.Path(certdir.FileCACert))
	case st.has(initOutputs...):
		var present []File
		for _, n := range initOutputs {
			present = append(present, File{Name: n})
		}
		return fmt.Errorf("%w: %v", ErrExists, st.present(present))
	}
	return nil
}

// importKey puts the source key on the device, or finds it there from an
// earlier run (same fingerprint).
func (c *Ceremony) importKey(ctx context.Context, st *state, o ImportOptions, fp string) (signer.Signer, []string, error) {
	uri, err := c.underAuthorities(ctx, st, o.SignerURI, o.Authorities)
	if err != nil {
		return nil, nil, err
	}
	s, err := c.Keys.Import(ctx, uri, o.Source.Key)
	switch {
	case err == nil:
		c.step("import key imported")
		return s, nil, nil
	case errors.Is(err, signer.ErrKeyExists):
		return c.importedEarlier(ctx, st, uri, fp)
	}
	return nil, nil, err
}

// importedEarlier accepts the key at uri only if it is the source key.
func (c *Ceremony) importedEarlier(ctx context.Context, st *state, uri, fp string) (signer.Signer, []string, error) {
	s, err := c.Keys.Open(ctx, uri)
	if err != nil {
		return nil, nil, fmt.Errorf("a key exists at the signer URI but cannot be opened: %w", err)
	}
	desc := s.Describe()
	if desc.Fingerprint != fp {
		return nil, nil, errors.Join(&ForeignKeyError{Fingerprint: desc.Fingerprint, Location: desc.Location, Receipts: st.dir.Path(certdir.DirReceipts)}, s.Close())
	}
	return s, []string{"the key was already in place from an earlier run (" + desc.Location + ")"}, nil
}

// importResults is what the device produced for Import.
type importResults struct {
	key        signer.Description
	keyResumed []string
	newToken   string
}

// planImport decides Import's files and receipt: the source's token, else
// an earlier run's, else a new one (with a note to patch the workers).
func planImport(st *state, o ImportOptions, r importResults) (*plan, error) {
	src := o.Source
	p := &plan{op: string(opImport), resumed: r.keyResumed}
	resuming := st.ca != nil && st.ca.Equal(src.Cert)
	token := src.Token
	if token == "" && resuming && st.token != "" {
		token = st.token
		p.resumed = append(p.resumed, st.dir.Path(certdir.FileToken)+" kept")
	}
	if token == "" {
		token = r.newToken
		p.notes = append(p.notes, "a new worker token was generated: existing workers keep theirs until their machine config is patched with "+st.dir.Path(certdir.FileWorkerPatch)+" (import from --talos-secrets to keep the cluster's token)")
	}
	cluster := o.Cluster
	if cluster == "" {
		cluster = src.Cert.Subject.CommonName
	}
	files, err := clusterFiles(cluster, src.Cert, nil, token, nil, nil)
	if err != nil {
		return nil, err
	}
	if resuming && !o.Force && st.matches(files) && st.receipt(opImport, r.key.Fingerprint, pki.CertFingerprint(src.Cert)) != nil {
		p.alreadyDone, p.notes = true, []string{destroySourceNote(r.key)}
		return p, nil
	}
	p.files = files
	p.receipt = newReceipt(opImport, r.key)
	certReceipt(&p.receipt, src.Cert)
	if r.key.Extractable {
		p.notes = append(p.notes, "WARNING: the backend reports the key as extractable ("+r.key.Backend+"); it is not protected by a device")
	}
	p.notes = append(p.notes, destroySourceNote(r.key))
	return p, nil
}

// destroySourceNote says where the key now is (an extractable key, a
// file key always, is held by no device) and that every copy of the
// source must go.
func destroySourceNote(key signer.Description) string {
	where := "is on the device (" + key.Location + ")"
	if key.Extractable {
		where = "is at " + key.Location + " (extractable: no device keeps it from being copied)"
	}
	return "the key " + where + " and signs correctly: now destroy every copy of the source key, including backups " +
		"(a key file: shred -u; a secrets.yaml: the import writes its worker secrets file without the OS CA key, then destroy the original)"
}
