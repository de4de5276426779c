package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
)

// TestRevocationUsageErrors: --revocable, --revocation-index, policy
// revoke and approve --epoch refuse what cannot work with exit 2 and say
// what to give instead.
func TestRevocationUsageErrors(t *testing.T) {
	dir := t.TempDir()
	key := "file:" + filepath.Join(dir, "ca.key")
	tpmKey := "tpm:path=" + filepath.Join(dir, "ca.tpmkey") + ";socket=/unused;approvals=" + dir
	handle := "tpm:handle=0x81000100;socket=/unused;approvals=" + dir
	pcr7 := "7=" + strings.Repeat("ab", 32)
	initArgs := func(extra ...string) []string {
		return append([]string{"init", "--signer", tpmKey, "--cluster", "c", "--out", dir}, extra...)
	}
	for _, tt := range []struct {
		name string
		args []string
		msg  string
	}{
		{"revocable without authority", initArgs("--revocable"), "--revocable applies to a tpm: key under a --policy-authority"},
		{"revocable on a file key", []string{"init", "--signer", key, "--cluster", "c", "--out", dir, "--revocable", "--policy-authority", key}, "--revocable applies to a tpm: key"},
		{"revocable and systemd", initArgs("--revocable", "--systemd-compatible", "--policy-authority", key), "exclude each other"},
		{"index without revocable", initArgs("--revocation-index", "0x01000100", "--policy-authority", key), "applies with --revocable"},
		{"index not hex", initArgs("--revocable", "--revocation-index", "12", "--policy-authority", key), "0x and 8 hex digits"},
		{"index outside the owner range", initArgs("--revocable", "--revocation-index", "0x01c00002", "--policy-authority", key), "owner NV index"},
		{"revoke without before", []string{"policy", "revoke", "--signer", tpmKey}, "--before"},
		{"revoke before zero", []string{"policy", "revoke", "--signer", tpmKey, "--before", "0"}, "positive epoch"},
		{"revoke before not a number", []string{"policy", "revoke", "--signer", tpmKey, "--before", "x"}, "positive epoch"},
		{"revoke without approvals dir", []string{"policy", "revoke", "--signer", "tpm:handle=0x81000100;socket=/unused", "--before", "2"}, "--dir"},
		{"epoch for a v2 key", []string{"policy", "approve", "--authority", key, "--signer", handle, "--pcr", pcr7, "--epoch", "3", "--out", "x"}, "--epoch applies to a revocable key"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runCmd(t, tt.args...)
			if code != cli.ExitUsage || !strings.Contains(stderr, tt.msg) {
				t.Fatalf("exit %d (want %d), stderr %q (want %q)", code, cli.ExitUsage, stderr, tt.msg)
			}
		})
	}
}
