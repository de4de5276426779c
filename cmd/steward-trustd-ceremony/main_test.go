package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/signer"
)

func runCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb, nil)
	return code, out.String(), errb.String()
}

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	key := "file:" + filepath.Join(dir, "ca.key")
	tests := []struct {
		name string
		args []string
		msg  string
	}{
		{"no command", nil, "a command is required"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"unknown flag", []string{"init", "--nope"}, "unknown flag: --nope"},
		{"positional", []string{"status", "--signer", key, "extra"}, `unexpected argument "extra"`},
		{"init missing flags", []string{"init"}, "--cluster, --out, --signer"},
		{"init bad algorithm", []string{"init", "--signer", key, "--cluster", "c", "--out", dir, "--algorithm", "dsa"}, "--algorithm"},
		{"init bad hours", []string{"init", "--signer", key, "--cluster", "c", "--out", dir, "--hours", "0"}, `invalid argument "0" for "--hours" flag: must be 1 to 175200 hours (20 years)`},
		{"init hours wrap", []string{"init", "--signer", key, "--cluster", "c", "--out", dir, "--hours", "2562048"}, "must be 1 to 175200"},
		{"init hours past 20 years", []string{"init", "--signer", key, "--cluster", "c", "--out", dir, "--hours", "2562047"}, "must be 1 to 175200"},
		{"init duplicate pcrs", []string{"init", "--signer", key, "--cluster", "c", "--out", dir, "--pcrs", "7,7"}, "PCR 7 given twice"},
		{"init bad pcrs", []string{"init", "--signer", key, "--cluster", "c", "--out", dir, "--pcrs", "99"}, "--pcrs"},
		{"init pcrs on file", []string{"init", "--signer", key, "--cluster", "c", "--out", dir, "--pcrs", "7"}, "only applies to tpm"},
		{"import no source", []string{"import", "--signer", key, "--out", dir}, "give --key and --cert, or --talos-secrets"},
		{"import both sources", []string{"import", "--signer", key, "--out", dir, "--key", "k", "--cert", "c", "--talos-secrets", "s"}, "not both"},
		{"import secrets out alone", []string{"import", "--signer", key, "--out", dir, "--key", "k", "--cert", "c", "--talos-secrets-out", "w.yaml"}, "--talos-secrets-out needs --talos-secrets"},
		{"import secrets out over source", []string{"import", "--signer", key, "--out", dir, "--talos-secrets", "s.yaml", "--talos-secrets-out", "./s.yaml"}, "must not be the --talos-secrets file"},
		{"sign-csr without roles", []string{"sign-csr", "--signer", key, "--ca", "x", "--csr", "y", "--out", "z"}, "--roles not set"},
		{"sign-csr leaf hours", []string{"sign-csr", "--signer", key, "--ca", "x", "--csr", "y", "--out", "z", "--roles", "os:reader", "--hours", "87601"}, "must be 1 to 87600 hours (10 years)"},
		{"sign-csr unknown role", []string{"sign-csr", "--signer", key, "--ca", "x", "--csr", "y", "--out", "z", "--roles", "os:root"}, "unknown role"},
		{"sign-csr empty roles", []string{"sign-csr", "--signer", key, "--ca", "x", "--csr", "y", "--out", "z", "--roles", ""}, "no role"},
		{"talosconfig no endpoints", []string{"talosconfig", "--signer", key, "--ca", "x", "--context", "c", "--out", "z"}, "--endpoints"},
		{"talosconfig bad endpoint", []string{"talosconfig", "--signer", key, "--ca", "x", "--context", "c", "--out", "z", "--endpoints", "a b"}, "--endpoints"},
		{"server-cert no san", []string{"server-cert", "--signer", key, "--ca", "x", "--out", dir}, "--san"},
		{"rotate finish with algorithm", []string{"rotate", "--new-signer", key, "--out", dir, "--finish", "--algorithm", "p384"}, "--algorithm applies to starting a rotation, not to --finish"},
		{"rotate finish with hours", []string{"rotate", "--new-signer", key, "--out", dir, "--finish", "--hours", "5"}, "--hours applies to starting"},
		{"rotate bad hours", []string{"rotate", "--new-signer", key, "--out", dir, "--hours", "-1"}, `"--hours" flag`},
		{"server-cert bad hours", []string{"server-cert", "--signer", key, "--ca", "x", "--out", dir, "--san", "a", "--hours", "x"}, "not a whole number of hours"},
		{"doctor timeout too long", []string{"doctor", "--machineconfig", "x", "--timeout", "1h"}, "must be 100ms to 5m0s"},
		{"force with a value that is no bool", []string{"init", "--force=maybe"}, "--force"},
		{"status bad output", []string{"status", "--signer", key, "--output", "xml"}, "--output must be text or json"},
		{"doctor missing config", []string{"doctor"}, "--machineconfig"},
		{"rotate without the current root", []string{"rotate", "--new-signer", key, "--out", dir}, "--signer not set: the current root's key vouches"},
		{"intermediate rotate with --signer", []string{"rotate", "--intermediate", "--signer", key, "--new-signer", key, "--out", dir, "--name", "n"}, "--signer applies to a root rotation"},
		{"trust without CA", []string{"trust", "add", "--signer", key, "--ca", "x"}, "accepts 1 arg"},
		{"trust without signer", []string{"trust", "remove", "--ca", "x", "y"}, "--signer"},
		{"fleet check without nodes", []string{"fleet", "check", "--ca", "x"}, "--nodes"},
		{"fleet check concurrency", []string{"fleet", "check", "--ca", "x", "--nodes", "10.0.0.0/30", "--concurrency", "0"}, "--concurrency 0"},
		{"fleet check timeout", []string{"fleet", "check", "--ca", "x", "--nodes", "10.0.0.0/30", "--timeout", "2m"}, "--timeout 2m0s"},
		{"fleet check huge CIDR", []string{"fleet", "check", "--ca", "x", "--nodes", "10.0.0.0/8"}, "more than the limit of 1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runCmd(t, tt.args...)
			if code != cli.ExitUsage {
				t.Fatalf("exit %d, want %d; stderr %s", code, cli.ExitUsage, stderr)
			}
			if !strings.Contains(stderr, tt.msg) {
				t.Errorf("stderr %q does not mention %q", stderr, tt.msg)
			}
		})
	}
}

func TestOperationErrors(t *testing.T) {
	dir := t.TempDir()
	key := "file:" + filepath.Join(dir, "ca.key")
	out := filepath.Join(dir, "ceremony")
	if code, _, stderr := runCmd(t, "init", "--signer", key, "--cluster", "c", "--out", out); code != cli.ExitOK {
		t.Fatalf("init: %d %s", code, stderr)
	}
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(out, "os-ca.crt")
	missingModule := "pkcs11:token=t;object=o?module-path=/nonexistent.so&pin-value=1234"
	tests := []struct {
		name string
		args []string
		msg  string
	}{
		{"missing key", []string{"status", "--signer", "file:" + filepath.Join(dir, "nope.key")}, "key not found"},
		{"bad scheme", []string{"status", "--signer", "gpg:whatever"}, "unknown scheme"},
		{"init refuses overwrite", []string{"init", "--signer", "file:" + filepath.Join(dir, "k2.key"), "--cluster", "c", "--out", out}, "refusing to overwrite"},
		{"missing ca file", []string{"sign-csr", "--signer", key, "--ca", filepath.Join(dir, "none.crt"), "--csr", garbage, "--roles", "os:reader", "--out", filepath.Join(dir, "o.crt")}, "no such file"},
		{"garbage ca", []string{"sign-csr", "--signer", key, "--ca", garbage, "--csr", garbage, "--roles", "os:reader", "--out", filepath.Join(dir, "o.crt")}, "no PEM CERTIFICATE block"},
		{"garbage csr", []string{"sign-csr", "--signer", key, "--ca", ca, "--csr", garbage, "--roles", "os:reader", "--out", filepath.Join(dir, "o.crt")}, "CERTIFICATE REQUEST"},
		{"garbage import key", []string{"import", "--signer", "file:" + filepath.Join(dir, "i.key"), "--key", garbage, "--cert", ca, "--out", filepath.Join(dir, "i")}, "no private key PEM block"},
		{"garbage machine config", []string{"doctor", "--machineconfig", garbage}, "machine config"},
		{"rotate finish without start", []string{"rotate", "--new-signer", key, "--out", out, "--finish"}, "no rotation in progress"},
		{"init on a missing module", []string{"init", "--signer", missingModule, "--cluster", "c", "--out", filepath.Join(dir, "new", "init")}, "nonexistent.so"},
		{"import to a missing module", []string{"import", "--signer", missingModule, "--key", filepath.Join(dir, "ca.key"), "--cert", ca, "--out", filepath.Join(dir, "new", "import")}, "nonexistent.so"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runCmd(t, tt.args...)
			if code != cli.ExitFailed {
				t.Fatalf("exit %d, want %d; stderr %s", code, cli.ExitFailed, stderr)
			}
			if !strings.Contains(stderr, tt.msg) {
				t.Errorf("stderr %q does not mention %q", stderr, tt.msg)
			}
		})
	}
	// Nothing was written by the failed commands, not even an empty --out
	// (nor its parent "new", which init and import created).
	for _, p := range []string{filepath.Join(dir, "o.crt"), filepath.Join(dir, "k2.key"), filepath.Join(dir, "i"), filepath.Join(dir, "new")} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s exists after a failed command", p)
		}
	}
}

func TestStatusJSON(t *testing.T) {
	dir := t.TempDir()
	key := "file:" + filepath.Join(dir, "ca.key")
	out := filepath.Join(dir, "ceremony")
	if code, _, stderr := runCmd(t, "init", "--signer", key, "--cluster", "c", "--out", out); code != cli.ExitOK {
		t.Fatalf("init: %s", stderr)
	}
	code, stdout, stderr := runCmd(t, "status", "--signer", key, "--ca", filepath.Join(out, "os-ca.crt"), "--output", "json")
	if code != cli.ExitOK {
		t.Fatalf("status: %s", stderr)
	}
	var st struct {
		Key struct {
			Backend     string
			Fingerprint string
			Extractable bool
		}
		CA struct {
			KeyMatches bool
			Subject    string
		}
		Receipts []struct{ Operation string }
	}
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if st.Key.Backend != "file" || !st.Key.Extractable || !st.CA.KeyMatches || st.CA.Subject != "CN=c,O=talos" || len(st.Receipts) != 2 {
		t.Errorf("status json %+v", st)
	}
	code, stdout, _ = runCmd(t, "status", "--signer", key, "--ca", filepath.Join(out, "os-ca.crt"))
	if code != cli.ExitOK || !strings.Contains(stdout, "key matches:  true") || !strings.Contains(stdout, "init.key") {
		t.Errorf("status text (%d):\n%s", code, stdout)
	}
}

// TestStatusAcceptedCAs: status checks issuer.crt against os-ca.crt and
// the CAs of accepted-cas.crt the root vouches for, as the daemon does,
// so an intermediate from the previous root (kept in accepted-cas.crt
// after a root rotation, vouched for by the new root) is not reported as
// refused, and one under an unvouched CA is, with a warning naming it.
func TestStatusAcceptedCAs(t *testing.T) {
	dir := t.TempDir()
	for _, r := range []string{"old", "new"} {
		if code, _, stderr := runCmd(t, "init", "--signer", "file:"+filepath.Join(dir, r+".key"), "--cluster", "c", "--out", filepath.Join(dir, r)); code != cli.ExitOK {
			t.Fatalf("init %s: %s", r, stderr)
		}
	}
	node := filepath.Join(dir, "node")
	nodeKey := "file:" + filepath.Join(dir, "node.key")
	if code, _, stderr := runCmd(t, "intermediate", "request", "--signer", nodeKey, "--name", "n", "--out", filepath.Join(node, "n.csr")); code != cli.ExitOK {
		t.Fatalf("request: %s", stderr)
	}
	if code, _, stderr := runCmd(t, "intermediate", "sign", "--signer", "file:"+filepath.Join(dir, "old.key"), "--ca", filepath.Join(dir, "old", "os-ca.crt"),
		"--csr", filepath.Join(node, "n.csr"), "--out", filepath.Join(node, "issuer.crt")); code != cli.ExitOK {
		t.Fatalf("sign: %s", stderr)
	}
	copyFile(t, filepath.Join(dir, "new", "os-ca.crt"), filepath.Join(node, "os-ca.crt"))
	if code, _, _ := runCmd(t, "status", "--signer", nodeKey, "--ca", filepath.Join(node, "os-ca.crt")); code != cli.ExitFailed {
		t.Errorf("status of an intermediate under a root the cert dir does not trust: exit %d", code)
	}
	copyFile(t, filepath.Join(dir, "old", "os-ca.crt"), filepath.Join(node, "accepted-cas.crt"))
	if code, _, stderr := runCmd(t, "status", "--signer", nodeKey, "--ca", filepath.Join(node, "os-ca.crt")); code != cli.ExitFailed || !strings.Contains(stderr, "does not vouch for") {
		t.Errorf("status of an intermediate under an unvouched CA of accepted-cas.crt: exit %d\n%s", code, stderr)
	}
	// The new root vouches for the old one; its directory's files go to the node.
	if code, _, stderr := runCmd(t, "trust", "add", "--signer", "file:"+filepath.Join(dir, "new.key"), "--ca", filepath.Join(dir, "new", "os-ca.crt"), filepath.Join(dir, "old", "os-ca.crt")); code != cli.ExitOK {
		t.Fatalf("trust add: %s", stderr)
	}
	for _, f := range []string{"accepted-cas.crt", "accepted-cas.statement.json"} {
		copyFile(t, filepath.Join(dir, "new", f), filepath.Join(node, f))
	}
	if code, stdout, stderr := runCmd(t, "status", "--signer", nodeKey, "--ca", filepath.Join(node, "os-ca.crt")); code != cli.ExitOK {
		t.Errorf("status of an intermediate under a vouched root in accepted-cas.crt: exit %d\n%s%s", code, stdout, stderr)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err == nil {
		err = os.WriteFile(to, b, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestKeyRoles: each command opens its --signer as the key it is, so a
// file key's warning names the right one.
func TestKeyRoles(t *testing.T) {
	tests := []struct {
		args []string
		want signer.KeyRole
	}{
		{[]string{"init"}, signer.RoleOSCA},
		{[]string{"intermediate", "sign"}, signer.RoleOSCA},
		{[]string{"intermediate", "request"}, signer.RoleIntermediate},
		{[]string{"intermediate", "install"}, signer.RoleIntermediate},
		{[]string{"rotate"}, signer.RoleOSCA},
		{[]string{"rotate", "--intermediate"}, signer.RoleIntermediate},
		{[]string{"policy", "approve"}, signer.RoleAuthority},
		{[]string{"log", "init"}, signer.RoleIssuanceLog},
		{[]string{"log", "witness"}, signer.RoleLogWitness},
		{[]string{"status"}, ""},
	}
	for _, tt := range tests {
		root := newRoot(defaultEnvironment(), io.Discard, io.Discard)
		cmd, rest, err := root.Find(tt.args)
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Fatal(err)
		}
		if got := keyRole(cmd); got != tt.want {
			t.Errorf("%v: role %q, want %q", tt.args, got, tt.want)
		}
	}
}
