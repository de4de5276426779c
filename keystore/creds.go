package keystore

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"go.yaml.in/yaml/v4"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/file"
)

// File names of the daemon's certificate directory (TRUSTD_CERT_DIR) and of
// the ceremony's other outputs.
const (
	// FileCACert is the issuing OS CA certificate.
	FileCACert = "os-ca.crt"
	// FileCAKey is the OS CA key of the file backend (gencreds only).
	FileCAKey = "os-ca.key"
	// FileServerCert is trustd's TLS serving certificate.
	FileServerCert = "server.crt"
	// FileServerKey is its private key.
	FileServerKey = "server.key"
	// FileToken is the worker join token (machine.token).
	FileToken = "token"
	// FileAcceptedCAs holds CAs trusted besides os-ca.crt (during a rotation).
	FileAcceptedCAs = "accepted-cas.crt"
	// FileNextCACert is the new CA of a rotation in progress.
	FileNextCACert = "os-ca.next.crt"
	// FileKubernetesSecret is the Secret manifest for the daemon's cert dir.
	FileKubernetesSecret = "kubernetes-secret.yaml"
	// FileWorkerPatch is the worker machine-config fragment.
	FileWorkerPatch = "worker-machineconfig-patch.yaml"
	// DirReceipts holds the ceremony receipts.
	DirReceipts = "receipts"
)

// TokenBytes is the entropy of a generated worker token.
const TokenBytes = 32

// NewToken returns TokenBytes random bytes from r, hex encoded.
func NewToken(r io.Reader) (string, error) {
	b := make([]byte, TokenBytes)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", fmt.Errorf("generate token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// EncodeCertificates PEM-encodes certs in order.
func EncodeCertificates(certs ...*x509.Certificate) []byte {
	var buf bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}) // a bytes.Buffer write cannot fail
	}
	return buf.Bytes()
}

// ParseCertificates parses every CERTIFICATE block of a PEM bundle; other
// block types are an error, and so is an empty bundle.
func ParseCertificates(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("unexpected PEM block %q in a certificate file", block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM CERTIFICATE block found")
	}
	// pem.Decode stops at what it cannot parse, so a truncated last block
	// would otherwise vanish silently.
	if len(bytes.TrimSpace(data)) > 0 {
		return nil, errors.New("trailing data after the last certificate: truncated or corrupted file")
	}
	return out, nil
}

// ParseCertificate parses a PEM file holding exactly one certificate.
func ParseCertificate(data []byte) (*x509.Certificate, error) {
	certs, err := ParseCertificates(data)
	if err != nil {
		return nil, err
	}
	if len(certs) != 1 {
		return nil, fmt.Errorf("expected one certificate, found %d", len(certs))
	}
	return certs[0], nil
}

// CertFingerprint is the lowercase hex SHA-256 of the certificate's DER.
func CertFingerprint(c *x509.Certificate) string {
	return hex.EncodeToString(sha256Sum(c.Raw))
}

// KeyMatchesCert reports whether pub is the certificate's public key.
func KeyMatchesCert(pub crypto.PublicKey, c *x509.Certificate) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := pub.(equaler)
	return ok && e.Equal(c.PublicKey)
}

// KubernetesSecretName is the Secret's name for a cluster.
func KubernetesSecretName(cluster string) string { return "steward-trustd-" + cluster }

// kubeSecret is a core/v1 Secret with only the fields we set.
type kubeSecret struct {
	APIVersion string            `yaml:"apiVersion"`
	Kind       string            `yaml:"kind"`
	Metadata   kubeMeta          `yaml:"metadata"`
	Type       string            `yaml:"type"`
	DataB64    map[string]string `yaml:"data"`
}

type kubeMeta struct {
	Name   string            `yaml:"name"`
	Labels map[string]string `yaml:"labels"`
}

// KubernetesSecret renders a v1 Secret named steward-trustd-<cluster>,
// label app.kubernetes.io/name=steward-trustd, type Opaque, whose data keys
// are the given file names (base64 as the API requires). Mount it as the
// daemon's TRUSTD_CERT_DIR.
func KubernetesSecret(cluster string, files map[string][]byte) ([]byte, error) {
	if cluster == "" {
		return nil, errors.New("kubernetes secret: cluster name is empty")
	}
	s := kubeSecret{
		APIVersion: "v1",
		Kind:       "Secret",
		Metadata: kubeMeta{
			Name:   KubernetesSecretName(cluster),
			Labels: map[string]string{"app.kubernetes.io/name": "steward-trustd"},
		},
		Type:    "Opaque",
		DataB64: make(map[string]string, len(files)),
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s.DataB64[n] = b64(files[n])
	}
	out, err := yaml.Marshal(&s)
	if err != nil {
		return nil, fmt.Errorf("marshal kubernetes secret: %w", err)
	}
	return out, nil
}

// workerPatch mirrors the fields of Talos's v1alpha1 MachineConfig a
// worker needs to join through trustd (pkg/machinery/config/types/v1alpha1:
// MachineToken `yaml:"token"`, MachineCA `yaml:"ca"` with `crt`,
// MachineAcceptedCAs `yaml:"acceptedCAs"`, a list of `crt`). The CA key is
// never part of it.
type workerPatch struct {
	Machine workerMachine `yaml:"machine"`
}

type workerMachine struct {
	Token       string   `yaml:"token"`
	CA          pemCrt   `yaml:"ca"`
	AcceptedCAs []pemCrt `yaml:"acceptedCAs,omitempty"`
}

type pemCrt struct {
	Crt string `yaml:"crt"`
}

// WorkerPatch renders the worker machine-config fragment (a strategic merge
// patch for `talosctl gen config --config-patch-worker` or
// `talosctl patch mc`): machine.token, machine.ca.crt = ca and
// machine.acceptedCAs = accepted. It holds the token: write it 0600.
func WorkerPatch(token string, ca *x509.Certificate, accepted []*x509.Certificate) ([]byte, error) {
	p := workerPatch{Machine: workerMachine{Token: token, CA: pemCrt{Crt: b64(EncodeCertificates(ca))}}}
	for _, c := range accepted {
		p.Machine.AcceptedCAs = append(p.Machine.AcceptedCAs, pemCrt{Crt: b64(EncodeCertificates(c))})
	}
	out, err := yaml.Marshal(&p)
	if err != nil {
		return nil, fmt.Errorf("marshal worker patch: %w", err)
	}
	return out, nil
}

// CredentialsOptions configures GenerateCredentials.
type CredentialsOptions struct {
	// Cluster names the CA and the Kubernetes Secret.
	Cluster string
	// Hosts are the serving certificate's IP addresses and DNS names.
	Hosts []string
	// Algorithm of the CA key: signer.ECDSAP256 (default) or signer.Ed25519.
	Algorithm signer.Algorithm
	// Now is the issuance time.
	Now time.Time
	// Rand supplies serials and the token.
	Rand io.Reader
}

// GenerateCredentials creates a complete file-backed credential set for
// the daemon's certificate directory, in memory: os-ca.crt, os-ca.key,
// server.crt, server.key, token and kubernetes-secret.yaml, all mode 0600.
// Nothing is written; pass the result to WriteSet.
func GenerateCredentials(o CredentialsOptions) ([]File, error) {
	if o.Cluster == "" {
		return nil, errors.New("cluster name is required")
	}
	if o.Algorithm == "" {
		o.Algorithm = signer.ECDSAP256
	}
	if o.Algorithm != signer.ECDSAP256 && o.Algorithm != signer.Ed25519 {
		return nil, fmt.Errorf("%w: %q (gencreds supports p256 and ed25519)", signer.ErrUnsupportedAlgorithm, o.Algorithm)
	}
	if len(o.Hosts) == 0 {
		o.Hosts = []string{"127.0.0.1", "localhost"}
	}
	if _, _, err := SplitHosts(o.Hosts); err != nil {
		return nil, err
	}
	caKey, err := file.GenerateKey(o.Rand, o.Algorithm)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	ca, err := NewCACertificate(caKey, CAOptions{Cluster: o.Cluster}, o.Now, o.Rand)
	if err != nil {
		return nil, err
	}
	caKeyPEM, err := file.MarshalPrivateKeyPEM(caKey)
	if err != nil {
		return nil, err
	}
	srvCert, srvKeyPEM, err := issueServing(ca, caKey, o.Hosts, 0, o.Now, o.Rand)
	if err != nil {
		return nil, err
	}
	token, err := NewToken(o.Rand)
	if err != nil {
		return nil, err
	}
	content := map[string][]byte{
		FileCACert:     EncodeCertificates(ca),
		FileCAKey:      caKeyPEM,
		FileServerCert: EncodeCertificates(srvCert),
		FileServerKey:  srvKeyPEM,
		FileToken:      []byte(token),
	}
	secret, err := KubernetesSecret(o.Cluster, content)
	if err != nil {
		return nil, err
	}
	return []File{
		// The key first and the secret manifest last: a reader that sees
		// the manifest sees a complete set.
		{Name: FileCAKey, Data: content[FileCAKey], Mode: 0o600},
		{Name: FileCACert, Data: content[FileCACert], Mode: 0o600},
		{Name: FileServerKey, Data: content[FileServerKey], Mode: 0o600},
		{Name: FileServerCert, Data: content[FileServerCert], Mode: 0o600},
		{Name: FileToken, Data: content[FileToken], Mode: 0o600},
		{Name: FileKubernetesSecret, Data: secret, Mode: 0o600},
	}, nil
}

// issueServing generates a P-256 serving key locally and has caKey sign
// its certificate for hosts.
func issueServing(ca *x509.Certificate, caKey crypto.Signer, hosts []string, validity time.Duration, now time.Time, r io.Reader) (*x509.Certificate, []byte, error) {
	key, err := file.GenerateKey(r, signer.ECDSAP256)
	if err != nil {
		return nil, nil, fmt.Errorf("generate serving key: %w", err)
	}
	cert, err := NewServingCertificate(ca, caKey, key.Public(), hosts, validity, now, r)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := file.MarshalPrivateKeyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return cert, keyPEM, nil
}
