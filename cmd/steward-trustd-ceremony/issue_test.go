package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
)

// ceremonyDir runs init with a file key and returns the key URI and the
// CA certificate path.
func ceremonyDir(t *testing.T) (key, ca string) {
	t.Helper()
	dir := t.TempDir()
	key = "file:" + filepath.Join(dir, "ca.key")
	out := filepath.Join(dir, "ceremony")
	if code, _, stderr := runCmd(t, "init", "--signer", key, "--cluster", "c", "--out", out); code != cli.ExitOK {
		t.Fatalf("init: %s", stderr)
	}
	return key, filepath.Join(out, "os-ca.crt")
}

// writeCSR writes a request for cn asking for roles (its Organization).
func writeCSR(t *testing.T, cn string, roles ...string) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: roles}}, k)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), cn+".csr")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestSignCSRRoles(t *testing.T) {
	key, ca := ceremonyDir(t)
	tests := []struct {
		name    string
		asked   []string
		flags   []string
		code    int
		granted []string
		msg     string
	}{
		{"request without roles gets --roles", nil, []string{"--roles", "os:reader"}, cli.ExitOK, []string{"os:reader"}, ""},
		{"matching roles", []string{"os:reader", "os:etcd:backup"}, []string{"--roles", "os:etcd:backup", "--roles", "os:reader"}, cli.ExitOK, []string{"os:etcd:backup", "os:reader"}, ""},
		{"escalation refused", []string{"os:reader"}, []string{"--roles", "os:admin"}, cli.ExitUsage, nil,
			"the request asks for roles os:reader but --roles grants os:admin: re-run with --roles os:reader, or add --override-csr-roles"},
		{"downgrade refused", []string{"os:admin"}, []string{"--roles", "os:reader"}, cli.ExitUsage, nil, "--override-csr-roles"},
		{"override", []string{"os:admin"}, []string{"--roles", "os:reader", "--override-csr-roles"}, cli.ExitOK, []string{"os:reader"}, ""},
		{"no --roles even with a request", []string{"os:reader"}, nil, cli.ExitUsage, nil, "--roles not set"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "u.crt")
			args := append([]string{"sign-csr", "--signer", key, "--ca", ca, "--csr", writeCSR(t, fmt.Sprint("user", i), tt.asked...), "--out", out}, tt.flags...)
			code, _, stderr := runCmd(t, args...)
			if code != tt.code || !strings.Contains(stderr, tt.msg) {
				t.Fatalf("exit %d, want %d with %q; stderr %s", code, tt.code, tt.msg, stderr)
			}
			if tt.code != cli.ExitOK {
				if _, err := os.Stat(out); err == nil {
					t.Error("a refused sign-csr wrote --out")
				}
				return
			}
			got := slices.Sorted(slices.Values(readCert(t, out).Subject.Organization))
			if !slices.Equal(got, tt.granted) {
				t.Errorf("granted %q, want %q", got, tt.granted)
			}
		})
	}
}

// TestIssuingCommands runs each issuing command as documented, in both
// flag spellings, and checks the shared flags took effect.
func TestIssuingCommands(t *testing.T) {
	key, ca := ceremonyDir(t)
	dir := t.TempDir()
	csr := writeCSR(t, "alice")
	tests := []struct {
		name string
		args []string
		cert string
		// the cert's lifetime and, for sign-csr/talosconfig, roles
		hours int
	}{
		{"sign-csr", []string{"sign-csr", "--signer", key, "--ca", ca, "--csr", csr, "--roles", "os:reader", "--hours", "24", "--out", filepath.Join(dir, "a.crt")}, filepath.Join(dir, "a.crt"), 24},
		{"sign-csr single dash, bare -force", []string{"sign-csr", "-signer", key, "-ca", ca, "-csr", csr, "-roles=os:reader", "-out", filepath.Join(dir, "a.crt"), "-force"}, filepath.Join(dir, "a.crt"), 8760},
		{"server-cert", []string{"server-cert", "--signer", key, "--ca", ca, "--san", "10.5.0.2,trustd.example.com", "--san", "10.5.0.3", "--hours", "48", "--out", filepath.Join(dir, "srv")}, filepath.Join(dir, "srv", "server.crt"), 48},
		{"server-cert --force", []string{"server-cert", "--signer", key, "--ca", ca, "--san", "10.5.0.2", "--out", filepath.Join(dir, "srv"), "--force"}, filepath.Join(dir, "srv", "server.crt"), 8760},
		{"talosconfig", []string{"talosconfig", "--signer", key, "--ca", ca, "--context", "prod", "--endpoints", "10.5.0.2", "--out", filepath.Join(dir, "talosconfig")}, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, tt.args...)
			if code != cli.ExitOK {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			if !strings.Contains(stdout, "wrote ") {
				t.Errorf("stdout %q names no written file", stdout)
			}
			if tt.cert == "" {
				return
			}
			c := readCert(t, tt.cert)
			if got := c.NotAfter.Sub(c.NotBefore); got < time.Duration(tt.hours)*time.Hour || got > time.Duration(tt.hours)*time.Hour+2*time.Hour {
				t.Errorf("lifetime %v, want about %dh", got, tt.hours)
			}
		})
	}
	// Receipts went next to --ca, the default of --dir.
	entries, err := os.ReadDir(filepath.Join(filepath.Dir(ca), "receipts"))
	if err != nil || len(entries) < 2+len(tests) {
		t.Errorf("receipts: %d entries, %v", len(entries), err)
	}
	// Without --force the existing output is kept.
	code, _, stderr := runCmd(t, tests[0].args...)
	if code != cli.ExitFailed || !strings.Contains(stderr, "refusing to overwrite") {
		t.Errorf("re-run without --force: exit %d %s", code, stderr)
	}
}

func TestVersionAndCompletion(t *testing.T) {
	code, stdout, _ := runCmd(t, "--version")
	if code != cli.ExitOK || !strings.HasPrefix(stdout, "steward-trustd-ceremony version dev (go") {
		t.Errorf("--version: %d %q", code, stdout)
	}
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		code, stdout, stderr := runCmd(t, "completion", shell)
		if code != cli.ExitOK || !strings.Contains(stdout, "steward-trustd-ceremony") {
			t.Errorf("completion %s: %d %s", shell, code, stderr)
		}
	}
	code, stdout, _ = runCmd(t, "sign-csr", "--help")
	if code != cli.ExitOK || !strings.Contains(stdout, "--override-csr-roles") || !strings.Contains(stdout, "1 to 87600 hours (10 years)") {
		t.Errorf("sign-csr --help: %d\n%s", code, stdout)
	}
}
