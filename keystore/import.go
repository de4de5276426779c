package keystore

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v4"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/file"
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
	key, err := file.ParsePrivateKeyPEM(keyPEM)
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
}

// ErrEd25519TPM explains why an Ed25519 CA cannot go into a TPM.
var ErrEd25519TPM = errors.New("a TPM 2.0 cannot hold Ed25519 keys (Talos's default OS CA algorithm); " +
	"either create a new ECDSA CA on the TPM with `init --algorithm p256` and roll it out with `rotate`, " +
	"or import this key into a PKCS#11 HSM that supports EdDSA (CKM_EDDSA)")

// Import checks that the certificate matches the key and is a CA, puts the
// key into the device (non-extractable where the backend can enforce it),
// verifies it by signing on the device, and writes the cluster files and
// a receipt into d. The source key file is the caller's to destroy.
func (c *Ceremony) Import(ctx context.Context, d Dir, o ImportOptions) (*Outcome, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	src := o.Source
	if src == nil || src.Key == nil || src.Cert == nil {
		return nil, errors.New("import: a CA key and certificate are required")
	}
	if !pki.KeyMatchesCert(src.Key.Public(), src.Cert) {
		return nil, errors.New("import: the certificate's public key is not the key's: they are not a pair")
	}
	if !src.Cert.IsCA || src.Cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("import: the certificate is not a CA certificate (needs basicConstraints CA and keyUsage certSign)")
	}
	out := &Outcome{}
	fp, err := signer.Fingerprint(src.Key.Public())
	if err != nil {
		return nil, err
	}
	caData, err := readOptional(d, certdir.FileCACert)
	if err != nil {
		return nil, err
	}
	resuming := false
	if caData != nil {
		existing, perr := pki.ParseCertificate(caData)
		switch {
		case perr == nil && existing.Equal(src.Cert):
			resuming = true
		case !o.Force:
			return nil, fmt.Errorf("import: %w: %s holds another CA", ErrExists, d.Path(certdir.FileCACert))
		}
	}
	if !o.Force && !resuming {
		present := make([]File, len(initOutputs))
		for i, n := range initOutputs {
			present[i] = File{Name: n}
		}
		if err := CheckAbsent(d, present); err != nil {
			return nil, fmt.Errorf("import: %w", err)
		}
	}

	s, err := c.Keys.Import(ctx, o.SignerURI, src.Key)
	switch {
	case err == nil:
	case errors.Is(err, signer.ErrKeyExists):
		// An earlier run may have imported this very key: accept it
		// only if the device's key is the same key.
		s, err = c.Keys.Open(ctx, o.SignerURI)
		if err != nil {
			return nil, fmt.Errorf("import: a key exists at the signer URI but cannot be opened: %w", err)
		}
		if s.Describe().Fingerprint != fp {
			s.Close()
			return nil, fmt.Errorf("import: %w: the signer URI holds another key (fingerprint %s); choose another key location", signer.ErrKeyExists, s.Describe().Fingerprint)
		}
		out.Resumed = append(out.Resumed, "the key was already on the device")
	case errors.Is(err, signer.ErrUnsupportedAlgorithm):
		if _, ok := src.Key.Public().(ed25519.PublicKey); ok {
			return nil, fmt.Errorf("import: %w: %w", err, ErrEd25519TPM)
		}
		return nil, fmt.Errorf("import: %w", err)
	default:
		return nil, fmt.Errorf("import: %w", err)
	}
	defer s.Close()
	if err := VerifyDeviceSignature(s, src.Cert.PublicKey, c.Rand); err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	desc := s.Describe()

	token := src.Token
	if token == "" && resuming {
		t, err := readOptional(d, certdir.FileToken)
		if err != nil {
			return nil, err
		}
		token = strings.TrimSpace(string(t))
	}
	if token == "" {
		if token, err = certdir.NewToken(c.Rand); err != nil {
			return nil, err
		}
		out.Notes = append(out.Notes, "a new worker token was generated: existing workers keep theirs until their machine config is patched with "+d.Path(certdir.FileWorkerPatch)+" (import from --talos-secrets to keep the cluster's token)")
	}
	cluster := o.Cluster
	if cluster == "" {
		cluster = src.Cert.Subject.CommonName
	}
	files, err := clusterFiles(cluster, src.Cert, nil, token, nil)
	if err != nil {
		return nil, err
	}
	r := newReceipt("import", c.Version, c.now(), desc)
	certReceipt(&r, src.Cert)
	r.Files = fileNames(files)
	rf, err := receiptFile(d, r, c.Rand)
	if err != nil {
		return nil, err
	}
	if err := WriteSet(d, append(files, rf), true); err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	out.Receipt = r
	out.Written = paths(d, append(files, rf))
	if desc.Extractable {
		out.Notes = append(out.Notes, "WARNING: the backend reports the key as extractable ("+desc.Backend+"); it is not protected by a device")
	}
	out.Notes = append(out.Notes, "the key is on the device and signs correctly: now destroy every copy of the source key file (e.g. shred -u), including backups and secrets.yaml copies")
	return out, nil
}
