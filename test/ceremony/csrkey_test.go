package ceremony_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// TestSignCSRRefusesWhatTheDaemonRefuses checks that sign-csr applies the
// daemon's key rule (pki.CheckRequestKey): an RSA key under 2048 bits or
// an unsupported curve gets no talosctl certificate, and nothing is
// written.
func TestSignCSRRefusesWhatTheDaemonRefuses(t *testing.T) {
	root := t.TempDir()
	keyURI := "file:" + filepath.Join(root, "ca.key")
	dir := filepath.Join(root, "ceremony")
	mustCeremony(t, nil, "init", "--signer", keyURI, "--cluster", "keys", "--out", dir)
	rsa1024, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	for name, c := range map[string]struct {
		key  crypto.Signer
		want string
	}{
		"rsa1024": {rsa1024, "too small (minimum 2048)"},
		"p224":    {p224, "unsupported ECDSA curve"},
	} {
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "eve"}}, c.key)
		if err != nil {
			t.Fatal(err)
		}
		csr, out := filepath.Join(root, name+".csr"), filepath.Join(root, name+".crt")
		if err := os.WriteFile(csr, pki.EncodeCSR(der), 0o600); err != nil {
			t.Fatal(err)
		}
		r := ceremony(t, nil, "sign-csr", "--signer", keyURI, "--ca", filepath.Join(dir, certdir.FileCACert), "--csr", csr, "--roles", "os:reader", "--out", out)
		if r.code != 1 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%s: want exit 1 mentioning %q: %s", name, c.want, r)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%s: a certificate was written", name)
		}
	}
}
