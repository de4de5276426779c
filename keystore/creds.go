package keystore

import (
	"crypto"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"go.yaml.in/yaml/v4"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/keyutil"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

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
// token must be one token (certdir.NewestToken of a token file).
func WorkerPatch(token string, ca *x509.Certificate, accepted []*x509.Certificate) ([]byte, error) {
	if strings.ContainsAny(token, "\r\n") || token == "" {
		return nil, errors.New("worker patch: machine.token must be exactly one token")
	}
	p := workerPatch{Machine: workerMachine{Token: token, CA: pemCrt{Crt: base64.StdEncoding.EncodeToString(pki.EncodeCertificates(ca))}}}
	for _, c := range accepted {
		p.Machine.AcceptedCAs = append(p.Machine.AcceptedCAs, pemCrt{Crt: base64.StdEncoding.EncodeToString(pki.EncodeCertificates(c))})
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
	if _, _, err := pki.SplitHosts(o.Hosts); err != nil {
		return nil, err
	}
	caKey, err := keyutil.GenerateKey(o.Rand, o.Algorithm)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	ca, err := pki.NewCACertificate(caKey, pki.CAOptions{Cluster: o.Cluster}, o.Now, o.Rand)
	if err != nil {
		return nil, err
	}
	caKeyPEM, err := keyutil.MarshalPrivateKeyPEM(caKey)
	if err != nil {
		return nil, err
	}
	srvCert, srvKeyPEM, err := issueServing(ca, caKey, o.Hosts, 0, o.Now, o.Rand)
	if err != nil {
		return nil, err
	}
	token, err := certdir.NewToken(o.Rand)
	if err != nil {
		return nil, err
	}
	content := map[string][]byte{
		certdir.FileCACert:     pki.EncodeCertificates(ca),
		certdir.FileCAKey:      caKeyPEM,
		certdir.FileServerCert: pki.EncodeCertificates(srvCert),
		certdir.FileServerKey:  srvKeyPEM,
		certdir.FileToken:      certdir.TokenFile(token),
	}
	secret, err := certdir.KubernetesSecret(o.Cluster, content)
	if err != nil {
		return nil, err
	}
	return []File{
		// The key first and the secret manifest last: a reader that sees
		// the manifest sees a complete set.
		{Name: certdir.FileCAKey, Data: content[certdir.FileCAKey], Mode: 0o600},
		{Name: certdir.FileCACert, Data: content[certdir.FileCACert], Mode: 0o600},
		{Name: certdir.FileServerKey, Data: content[certdir.FileServerKey], Mode: 0o600},
		{Name: certdir.FileServerCert, Data: content[certdir.FileServerCert], Mode: 0o600},
		{Name: certdir.FileToken, Data: content[certdir.FileToken], Mode: 0o600},
		{Name: certdir.FileKubernetesSecret, Data: secret, Mode: 0o600},
	}, nil
}

// issueServing generates a P-256 serving key locally and has caKey sign
// its certificate for hosts.
func issueServing(ca *x509.Certificate, caKey crypto.Signer, hosts []string, validity time.Duration, now time.Time, r io.Reader) (*x509.Certificate, []byte, error) {
	key, err := keyutil.GenerateKey(r, signer.ECDSAP256)
	if err != nil {
		return nil, nil, fmt.Errorf("generate serving key: %w", err)
	}
	cert, err := pki.NewServingCertificate(ca, caKey, key.Public(), hosts, validity, now, r)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := keyutil.MarshalPrivateKeyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return cert, keyPEM, nil
}
