package main

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v4"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/keyutil"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

var outputs = []string{"os-ca.crt", "os-ca.key", "server.crt", "server.key", "token", "kubernetes-secret.yaml"}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"no flags", nil, "required flag(s) --cluster, --output not set"},
		{"no cluster", []string{"-output", "x"}, "--cluster not set"},
		{"no output", []string{"-cluster", "c"}, "--output not set"},
		{"bad algorithm", []string{"-cluster", "c", "-output", "x", "-algorithm", "rsa3072"}, "want p256 or ed25519"},
		{"unknown algorithm", []string{"-cluster", "c", "-output", "x", "-algorithm", "dsa"}, "want p256 or ed25519"},
		{"bad san", []string{"-cluster", "c", "-output", "x", "-san", "not a host"}, "neither an IP address nor a DNS name"},
		{"unknown flag", []string{"-nope"}, "unknown flag: --nope"},
		{"unknown double-dash flag", []string{"--nope"}, "unknown flag: --nope"},
		{"missing value", []string{"-cluster", "c", "-output"}, "flag needs an argument: --output"},
		{"bool with a value that is no bool", []string{"-cluster", "c", "-output", "x", "-force=maybe"}, `invalid argument "maybe" for "--force"`},
		{"positional", []string{"-cluster", "c", "-output", "x", "extra"}, `unexpected argument "extra"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(tt.args, &out, &errb); code != cli.ExitUsage {
				t.Fatalf("exit code %d, want %d; stderr %s", code, cli.ExitUsage, errb.String())
			}
			if !strings.Contains(errb.String(), tt.wantErr) {
				t.Errorf("stderr %q does not mention %q", errb.String(), tt.wantErr)
			}
		})
	}
}

func TestGenerate(t *testing.T) {
	for _, tt := range []struct {
		name  string
		flags []string
		alg   string
		sans  []string
	}{
		{"defaults single dash", []string{"-cluster", "demo"}, "ECDSA-P256", nil},
		{"single dash with =", []string{"-cluster=demo", "-san=10.5.0.2,api.example.com", "-algorithm=p256"}, "ECDSA-P256", []string{"10.5.0.2", "api.example.com"}},
		{"double dash ed25519", []string{"--cluster", "demo", "--algorithm", "ed25519", "--san", "10.5.0.2", "--san", "api.example.com,10.5.0.3"}, "Ed25519", []string{"10.5.0.2", "api.example.com", "10.5.0.3"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "certs")
			var out, errb bytes.Buffer
			flagOut := "-output"
			if strings.HasPrefix(tt.flags[0], "--") {
				flagOut = "--output"
			}
			args := append(append([]string{}, tt.flags...), flagOut, dir)
			if code := run(args, &out, &errb); code != cli.ExitOK {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			checkPrivateModes(t, dir)
			ca, key := checkPair(t, dir, "os-ca.key", "os-ca.crt")
			if got := ca.Subject.CommonName; got != "demo" {
				t.Errorf("CA CN %q", got)
			}
			srv, _ := checkPair(t, dir, "server.key", "server.crt")
			want := tt.sans
			if want == nil {
				want = []string{"127.0.0.1", "localhost"}
			}
			checkServes(t, srv, ca, want)
			if tok := readOutput(t, dir, "token"); len(tok) != 65 || tok[64] != '\n' {
				t.Errorf("token file %q, want 64 hex chars and a newline", tok)
			}
			checkSecret(t, dir)
			if got := signer.AlgorithmName(key.Public()); got != tt.alg {
				t.Errorf("algorithm %s, want %s", got, tt.alg)
			}
		})
	}
}

// readOutput returns the content of the output file n in dir.
func readOutput(t *testing.T, dir, n string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, n))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkPrivateModes checks that every output in dir is readable by its
// owner only.
func checkPrivateModes(t *testing.T, dir string) {
	t.Helper()
	for _, n := range outputs {
		st, err := os.Stat(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %04o, want 0600", n, st.Mode().Perm())
		}
	}
}

// checkPair parses the key and certificate files keyName and certName in
// dir, checks that they match and returns them.
func checkPair(t *testing.T, dir, keyName, certName string) (*x509.Certificate, crypto.Signer) {
	t.Helper()
	cert, err := pki.ParseCertificate(readOutput(t, dir, certName))
	if err != nil {
		t.Fatal(err)
	}
	key, err := keyutil.ParsePrivateKeyPEM(readOutput(t, dir, keyName))
	if err != nil {
		t.Fatal(err)
	}
	if !pki.KeyMatchesCert(key.Public(), cert) {
		t.Errorf("%s does not match %s", keyName, certName)
	}
	return cert, key
}

// checkServes checks that srv, issued by ca, is a serving certificate for
// every host of hosts.
func checkServes(t *testing.T, srv, ca *x509.Certificate, hosts []string) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	for _, h := range hosts {
		if _, err := srv.Verify(x509.VerifyOptions{Roots: pool, DNSName: h, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("server.crt for %s: %v", h, err)
		}
	}
}

// checkSecret checks that kubernetes-secret.yaml in dir is the Secret for
// cluster demo and holds exactly the other output files.
func checkSecret(t *testing.T, dir string) {
	t.Helper()
	var sec struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string
		Type       string
		Metadata   struct {
			Name   string
			Labels map[string]string
		}
		Data map[string]string
	}
	if err := yaml.Unmarshal(readOutput(t, dir, "kubernetes-secret.yaml"), &sec); err != nil {
		t.Fatal(err)
	}
	if sec.APIVersion != "v1" || sec.Kind != "Secret" || sec.Type != "Opaque" || sec.Metadata.Name != "steward-trustd-demo" ||
		sec.Metadata.Labels["app.kubernetes.io/name"] != "steward-trustd" {
		t.Errorf("secret header %+v", sec)
	}
	if len(sec.Data) != 5 {
		t.Errorf("secret data keys %d, want 5", len(sec.Data))
	}
	for _, n := range outputs[:5] {
		got, err := base64.StdEncoding.DecodeString(sec.Data[n])
		if err != nil || !bytes.Equal(got, readOutput(t, dir, n)) {
			t.Errorf("secret data %s does not equal the file (%v)", n, err)
		}
	}
}

func TestRefusesOverwrite(t *testing.T) {
	dir := t.TempDir()
	// One pre-existing target is enough to refuse the whole set.
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"-cluster", "c", "-output", dir}, &out, &errb); code != cli.ExitFailed {
		t.Fatalf("exit %d, want %d", code, cli.ExitFailed)
	}
	if !strings.Contains(errb.String(), "refusing to overwrite") || !strings.Contains(errb.String(), "token") {
		t.Errorf("stderr %q", errb.String())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory has %d entries after a refused run, want only the old token", len(entries))
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "token")); string(b) != "keep" {
		t.Error("token was replaced")
	}
	errb.Reset()
	if code := run([]string{"-cluster", "c", "-output", dir, "-force"}, &out, &errb); code != cli.ExitOK {
		t.Fatalf("-force: exit %d: %s", code, errb.String())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "token")); string(b) == "keep" {
		t.Error("-force did not replace the token")
	}
}

func TestHelpVersionCompletion(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-h"}, "-cluster NAME -output DIR"},
		{[]string{"-help"}, "--san list"},
		{[]string{"--help"}, "Flags take one dash or two"},
		{[]string{"--version"}, "steward-trustd-gencreds version dev (go"},
		{[]string{"-version"}, "steward-trustd-gencreds version dev"},
		{[]string{"completion", "bash"}, "__start_steward-trustd-gencreds"},
	} {
		var out, errb bytes.Buffer
		if code := run(tt.args, &out, &errb); code != cli.ExitOK || !strings.Contains(out.String(), tt.want) {
			t.Errorf("%q: exit %d, stdout does not contain %q:\n%s%s", tt.args, code, tt.want, out.String(), errb.String())
		}
	}
}
