package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

func TestPolicyUsageErrors(t *testing.T) {
	dir := t.TempDir()
	key := "file:" + filepath.Join(dir, "ca.key")
	tpmKey := "tpm:path=" + filepath.Join(dir, "ca.tpmkey") + ";socket=/unused"
	pcr7 := "7=" + strings.Repeat("ab", 32)
	handle := "tpm:handle=0x81000100;socket=/unused;approvals=" + dir
	tests := []struct {
		name string
		args []string
		msg  string
	}{
		{"init authority on a file key", []string{"init", "--signer", key, "--cluster", "c", "--out", dir, "--policy-authority", key}, "applies to tpm: keys only"},
		{"init authority without approvals dir", []string{"init", "--signer", tpmKey, "--cluster", "c", "--out", dir, "--policy-authority", key}, "must name its approvals directory"},
		{"init systemd-compatible without authority", []string{"init", "--signer", tpmKey, "--cluster", "c", "--out", dir, "--systemd-compatible"}, "--systemd-compatible applies to a tpm: key under a --policy-authority"},
		{"import systemd-compatible on a file key", []string{"import", "--signer", key, "--key", "k", "--cert", "c", "--out", dir, "--systemd-compatible", "--policy-authority", key}, "--systemd-compatible applies to a tpm: key"},
		{"init systemd-compatible over PCR 7", []string{"init", "--signer", tpmKey + ";approvals=" + dir, "--pcrs", "7", "--cluster", "c", "--out", dir, "--systemd-compatible", "--policy-authority", key}, "binds PCR 11"},
		{"rotate finish with authority", []string{"rotate", "--new-signer", key, "--out", dir, "--finish", "--policy-authority", key}, "--policy-authority applies to starting"},
		{"approve without authority", []string{"policy", "approve", "--pcr", pcr7, "--out", "x"}, "--authority"},
		{"approve without a key", []string{"policy", "approve", "--authority", key, "--pcr", pcr7, "--out", "x"}, "--key KEY.tpmkey"},
		{"approve without a state", []string{"policy", "approve", "--authority", key, "--key", "k.tpmkey", "--out", "x"}, "give the state to approve"},
		{"approve two states", []string{"policy", "approve", "--authority", key, "--pcr", pcr7, "--from-quote", "q", "--signer", handle, "--out", "x"}, "at most one"},
		{"approve resettable pcr", []string{"policy", "approve", "--authority", key, "--signer", handle, "--pcr", "16=" + strings.Repeat("00", 32), "--out", "x"}, "PCR 16 is the debug PCR"},
		{"approve for a key URI over PCR 16", []string{"policy", "approve", "--authority", key, "--signer", "tpm:handle=0x81000100;pcrs=16", "--pcr", pcr7, "--out", "x"}, "debug PCR"},
		{"approve short pcr value", []string{"policy", "approve", "--authority", key, "--signer", handle, "--pcr", "7=abcd", "--out", "x"}, "64 hex digits"},
		{"approve pcr out of range", []string{"policy", "approve", "--authority", key, "--signer", handle, "--pcr", "24=" + strings.Repeat("ab", 32), "--out", "x"}, "INDEX=HEX"},
		{"approve pcr twice", []string{"policy", "approve", "--authority", key, "--signer", handle, "--pcr", pcr7, "--pcr", pcr7, "--out", "x"}, "given twice"},
		{"approve nowhere to write", []string{"policy", "approve", "--authority", key, "--signer", "tpm:handle=0x81000100;socket=/unused", "--pcr", pcr7}, "--out FILE or --approvals DIR"},
		{"approve out and approvals", []string{"policy", "approve", "--authority", key, "--signer", handle, "--pcr", pcr7, "--out", "x", "--approvals", dir}, "not both"},
		{"approve nonce without quote", []string{"policy", "approve", "--authority", key, "--signer", handle, "--pcr", pcr7, "--nonce", "00", "--out", "x"}, "--from-quote"},
		{"approve quote without ak", []string{"policy", "approve", "--authority", key, "--signer", handle, "--from-quote", "q", "--nonce", "00", "--out", "x"}, "--ak"},
		{"approve bad nonce", []string{"policy", "approve", "--authority", key, "--signer", handle, "--from-quote", "q", "--ak", "a", "--nonce", "zz", "--out", "x"}, "--nonce must be hex"},
		{"quote nothing to do", []string{"policy", "quote", "--signer", tpmKey}, "--nonce HEX --out FILE"},
		{"quote nonce without out", []string{"policy", "quote", "--signer", tpmKey, "--nonce", "00"}, "go together"},
		{"quote long nonce", []string{"policy", "quote", "--signer", tpmKey, "--nonce", strings.Repeat("00", 33), "--out", "q"}, "1 to 32 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runCmd(t, tt.args...)
			if code != cli.ExitUsage || !strings.Contains(stderr, tt.msg) {
				t.Fatalf("exit %d (want %d), stderr %q (want %q)", code, cli.ExitUsage, stderr, tt.msg)
			}
		})
	}
}

func TestParsePCRValues(t *testing.T) {
	a, b := strings.Repeat("aa", 32), strings.Repeat("bb", 32)
	pcrs, vals, err := parsePCRValues([]string{"11=" + b, "7=" + a})
	if err != nil || len(pcrs) != 2 || pcrs[0] != 7 || pcrs[1] != 11 || !bytes.Equal(vals[0], bytes.Repeat([]byte{0xaa}, 32)) {
		t.Fatalf("parsePCRValues = %v %x %v", pcrs, vals, err)
	}
}

// TestPolicyAuthorityCreate: the authority key is created once (never
// replaced), its public key written, its fingerprints printed (systemd's
// too for RSA); an authority that does not exist is refused with the
// command that creates one.
func TestPolicyAuthorityCreate(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ alg, name string }{{"p256", "ecc"}, {"rsa2048", "rsa"}} {
		key := "file:" + filepath.Join(dir, tc.name+".key")
		pub := filepath.Join(dir, tc.name+".pub")
		code, stdout, stderr := runCmd(t, "policy", "authority", "create", "--key", key, "--algorithm", tc.alg, "--public-out", pub)
		if code != 0 || !strings.Contains(stdout, "fingerprint:  sha256 ") || strings.Contains(stdout, "systemd pkfp") != (tc.alg != "p256") {
			t.Fatalf("%s: exit %d\n%s\n%s", tc.alg, code, stdout, stderr)
		}
		data, err := os.ReadFile(pub)
		if err != nil || !bytes.HasPrefix(data, []byte("-----BEGIN PUBLIC KEY-----")) {
			t.Fatalf("%s: public key file: %v", tc.alg, err)
		}
		if code, _, stderr := runCmd(t, "policy", "authority", "create", "--key", key, "--algorithm", tc.alg); code != 1 || !strings.Contains(stderr, "exist") {
			t.Fatalf("%s: a second create: exit %d, %s", tc.alg, code, stderr)
		}
	}
	missing := "file:" + filepath.Join(dir, "missing.key")
	code, _, stderr := runCmd(t, "policy", "approve", "--authority", missing, "--signer", "tpm:handle=0x81000100;socket=/unused", "--pcr", "7="+strings.Repeat("ab", 32), "--out", filepath.Join(dir, "a.json"))
	if code != 1 || !strings.Contains(stderr, "steward-trustd-ceremony policy authority create --key") {
		t.Fatalf("approve with a missing authority: exit %d, %s", code, stderr)
	}
}

// TestPrintAuthorityHidesPIN: policy authority create echoes the key URI
// (and the next command with it); a pkcs11: URI's pin-value must not be
// printed.
func TestPrintAuthorityHidesPIN(t *testing.T) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	a, err := tpmpolicy.NewAuthority(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	const pin = "s3cret-pin-4711"
	var out strings.Builder
	printAuthority(&out, "pkcs11:token=hsm;object=authority?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-value="+pin, a)
	if strings.Contains(out.String(), pin) || !strings.Contains(out.String(), "object=authority") {
		t.Fatalf("printAuthority printed the PIN or lost the key's name:\n%s", out.String())
	}
	// The URI holds ';' and '&': the next command quotes it for the shell.
	if !strings.Contains(out.String(), "--policy-authority 'pkcs11:token=hsm;") {
		t.Fatalf("the next command does not quote the authority URI:\n%s", out.String())
	}
}
