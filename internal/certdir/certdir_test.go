package certdir

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v4"

	"github.com/steward-trustd/steward-trustd/internal/pki"
)

func newCA(t *testing.T, name string) *x509.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca, err := pki.NewCACertificate(key, pki.CAOptions{Cluster: name}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// serverOnlyCA is a CA whose EKU excludes ClientAuth.
func serverOnlyCA(t *testing.T) *x509.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "server-only"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c
}

func TestParseBundle(t *testing.T) {
	a, b := newCA(t, "a"), newCA(t, "b")
	pemOf := pki.EncodeCertificates
	tests := []struct {
		name    string
		ca, acc []byte
		want    []*x509.Certificate
		wantErr string
	}{
		{"CA only", pemOf(a), nil, []*x509.Certificate{a}, ""},
		{"blank accepted", pemOf(a), []byte("\n \n"), []*x509.Certificate{a}, ""},
		{"rotation", pemOf(a), pemOf(b), []*x509.Certificate{a, b}, ""},
		{"duplicates dropped", pemOf(a), pemOf(a, b, b), []*x509.Certificate{a, b}, ""},
		{"two in os-ca.crt", pemOf(a, b), nil, nil, "exactly one"},
		{"no EKU ClientAuth", pemOf(a), pemOf(serverOnlyCA(t)), nil, "without ClientAuth"},
		{"garbage accepted", pemOf(a), []byte("junk"), nil, "accepted CAs"},
	}
	for _, tt := range tests {
		ca, bundle, err := ParseBundle(tt.ca, tt.acc)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: err = %v, want %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !ca.Equal(a) || len(bundle) != len(tt.want) {
			t.Fatalf("%s: %v %d %v", tt.name, ca.Subject, len(bundle), err)
		}
		for i := range bundle {
			if !bundle[i].Equal(tt.want[i]) {
				t.Errorf("%s: bundle[%d] = %v", tt.name, i, bundle[i].Subject)
			}
		}
	}
}

func TestReadBundleAndClientTrust(t *testing.T) {
	aKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	a, b, next := newSignedCA(t, aKey), newCA(t, "b"), newCA(t, "next")
	dir := t.TempDir()
	d := OSDir(dir)
	if _, _, err := ReadBundle(d); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("empty dir: %v", err)
	}
	write := func(name string, certs ...*x509.Certificate) {
		if err := os.WriteFile(filepath.Join(dir, name), pki.EncodeCertificates(certs...), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(FileCACert, a)
	if _, bundle, err := ReadBundle(d); err != nil || len(bundle) != 1 {
		t.Fatalf("without accepted-cas.crt: %d, %v", len(bundle), err)
	}
	write(FileAcceptedCAs, b)
	write(FileNextCACert, next)
	if _, bundle, err := ReadBundle(d); err != nil || len(bundle) != 1 {
		t.Fatalf("with accepted-cas.crt the root did not vouch for: %d, %v", len(bundle), err)
	}
	statement, err := SignTrustStatement(aKey, rand.Reader, NewTrustStatement(a, 1, time.Now(), []*x509.Certificate{b}))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, FileTrustStatement), statement, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, bundle, err := ReadBundle(d); err != nil || len(bundle) != 2 {
		t.Fatalf("with accepted-cas.crt vouched for: %d, %v", len(bundle), err)
	}
	// A talosconfig signed by the next CA trusts every CA of the directory.
	trust, err := ClientTrust(next, d)
	if err != nil {
		t.Fatal(err)
	}
	if len(trust) != 3 || !trust[0].Equal(next) || !trust[1].Equal(a) || !trust[2].Equal(b) {
		t.Errorf("ClientTrust: %d CAs", len(trust))
	}
}

func TestKubernetesSecret(t *testing.T) {
	files := map[string][]byte{FileToken: []byte("t0ken"), FileCACert: []byte("-----BEGIN CERTIFICATE-----\n")}
	out, err := KubernetesSecret("prod", files)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := KubernetesSecret("prod", files)
	if !bytes.Equal(out, again) {
		t.Error("the manifest is not deterministic")
	}
	type secret struct {
		APIVersion string `json:"apiVersion" yaml:"apiVersion"`
		Kind       string `json:"kind" yaml:"kind"`
		Metadata   struct {
			Name   string            `json:"name" yaml:"name"`
			Labels map[string]string `json:"labels" yaml:"labels"`
		} `json:"metadata" yaml:"metadata"`
		Type string            `json:"type" yaml:"type"`
		Data map[string][]byte `json:"data" yaml:"-"`
	}
	var j secret
	if err := json.Unmarshal(out, &j); err != nil {
		t.Fatal(err)
	}
	if j.APIVersion != "v1" || j.Kind != "Secret" || j.Type != "Opaque" || j.Metadata.Name != "steward-trustd-prod" || j.Metadata.Labels["app.kubernetes.io/name"] != "steward-trustd" {
		t.Errorf("manifest %+v", j)
	}
	if len(j.Data) != 2 || !bytes.Equal(j.Data[FileToken], files[FileToken]) || !bytes.Equal(j.Data[FileCACert], files[FileCACert]) {
		t.Errorf("data %q", j.Data)
	}
	// kubectl reads it as YAML.
	var y struct {
		Kind string            `yaml:"kind"`
		Data map[string]string `yaml:"data"`
	}
	if err := yaml.Unmarshal(out, &y); err != nil || y.Kind != "Secret" || y.Data[FileToken] != "dDBrZW4=" {
		t.Errorf("as YAML: %+v, %v", y, err)
	}
	if _, err := KubernetesSecret("", files); err == nil {
		t.Error("empty cluster accepted")
	}
	if out, _ := KubernetesSecret("c", nil); !strings.Contains(string(out), `"data": {}`) {
		t.Errorf("no files: %s", out)
	}
}

func TestNewToken(t *testing.T) {
	tok, err := NewToken(rand.Reader)
	if err != nil || len(tok) != 2*TokenBytes || strings.Trim(tok, "0123456789abcdef") != "" {
		t.Errorf("token %q, %v", tok, err)
	}
	if _, err := NewToken(bytes.NewReader(make([]byte, TokenBytes-1))); err == nil {
		t.Error("short randomness accepted")
	}
}

func TestTokenFile(t *testing.T) {
	tests := []struct {
		content, file, newest string
	}{
		{"abc", "abc\n", "abc"},
		{"abc\n", "abc\n", "abc"},
		{" abc \r\n\n def\n", "abc\ndef\n", "def"},
		{"\n \n", "", ""},
	}
	for _, tt := range tests {
		if got := string(TokenFile(tt.content)); got != tt.file {
			t.Errorf("TokenFile(%q) = %q, want %q", tt.content, got, tt.file)
		}
		if got := NewestToken(tt.content); got != tt.newest {
			t.Errorf("NewestToken(%q) = %q, want %q", tt.content, got, tt.newest)
		}
	}
}
