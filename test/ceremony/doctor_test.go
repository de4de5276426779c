package ceremony_test

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
)

// runTool runs a binary and returns "" on success, else the error and
// its output.
func runTool(t *testing.T, bin string, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return err.Error() + "\n" + out.String()
	}
	return ""
}

// TestDoctorFindsProblems runs doctor against running daemons that are
// misconfigured in the ways users hit.
func TestDoctorFindsProblems(t *testing.T) {
	root := t.TempDir()
	keyURI := "file:" + filepath.Join(root, "ca.key")
	dir := filepath.Join(root, "ceremony")
	mustCeremony(t, nil, "init", "--signer", keyURI, "--cluster", "doc", "--out", dir)
	caCrt := filepath.Join(dir, certdir.FileCACert)
	patch := filepath.Join(dir, certdir.FileWorkerPatch)

	// A cert dir whose serving certificate lacks 127.0.0.1.
	noSAN := filepath.Join(root, "nosan")
	mustCeremony(t, nil, "server-cert", "--signer", keyURI, "--ca", caCrt, "--san", "10.9.9.9,trustd.example", "--out", noSAN)
	for _, n := range []string{certdir.FileCACert, certdir.FileToken} {
		if err := os.WriteFile(filepath.Join(noSAN, n), readFile(t, filepath.Join(dir, n)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A daemon of another cluster (another CA and token).
	other := filepath.Join(root, "other")
	if msg := runTool(t, filepath.Join(binDir, "steward-trustd-gencreds"), "-cluster", "other", "-output", other); msg != "" {
		t.Fatal(msg)
	}
	// The worker config with a wrong token.
	wrongTok := filepath.Join(root, "wrong-token.yaml")
	p := readFile(t, patch)
	tok := strings.TrimSpace(string(readFile(t, filepath.Join(dir, certdir.FileToken))))
	if err := os.WriteFile(wrongTok, bytes.Replace(p, []byte(tok), []byte(strings.Repeat("0", len(tok))), 1), 0o600); err != nil {
		t.Fatal(err)
	}

	mustCeremony(t, nil, "server-cert", "--signer", keyURI, "--ca", caCrt, "--san", "127.0.0.1", "--out", dir)
	good := startDaemon(t, dir, keyURI)
	badSAN := startDaemon(t, noSAN, keyURI)
	foreign := startDaemon(t, other, "file:"+filepath.Join(other, "os-ca.key"))
	closed := freeAddr(t)

	tests := []struct {
		name     string
		config   string
		endpoint string
		want     []string
	}{
		{"healthy", patch, good.Addr, []string{"ok   csr", "ok   talosctl access"}},
		{"wrong token", wrongTok, good.Addr, []string{"FAIL token", "wrong token"}},
		{"missing SAN", patch, badSAN.Addr, []string{"FAIL san match", "x509: certificate is valid for", "--san 127.0.0.1"}},
		{"untrusted server certificate", patch, foreign.Addr, []string{"FAIL tls chain", "not signed by machine.ca"}},
		{"nothing listening", patch, closed, []string{"FAIL tcp", "connection refused"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ceremony(t, nil, "doctor", "--machineconfig", tt.config, "--endpoint", tt.endpoint, "--timeout", "5s")
			wantCode := 1
			if tt.name == "healthy" {
				wantCode = 0
			}
			if r.code != wantCode {
				t.Fatalf("exit %d, want %d\n%s", r.code, wantCode, r)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("doctor output lacks %q:\n%s", w, r.stdout)
				}
			}
			if strings.Contains(r.stdout+r.stderr, tok) {
				t.Error("doctor printed the token")
			}
		})
	}
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
