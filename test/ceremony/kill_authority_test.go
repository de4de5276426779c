package ceremony_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// authorityScenarios create a TPM key under a policy authority: the
// approval of the TPM's PCR values, written before the key exists, is a
// step of the same operation under the directory's lock, and every kill
// between it and the key's receipts must resume to one approval with one
// receipt.
func authorityScenarios(sw *tpmsim.Swtpm) []killScenario {
	key := func(root string) string {
		return "tpm:path=" + filepath.Join(root, "keys", "ca.tpmkey") + ";" + sw.URIAttrs() + ";approvals=" + filepath.Join(root, "approvals")
	}
	authority := func(t *testing.T, root string) string {
		offline := filepath.Join(root, "offline")
		if err := os.Mkdir(offline, 0o700); err != nil {
			t.Fatal(err)
		}
		return devtest.FileKey(t, offline, "authority")
	}
	// A TPM key is two files, the blob and its creation record (a kill
	// while the record is written leaves a temporary link, which the
	// resumed run removes: checkLeftovers sees none).
	const keyFiles = 2
	return []killScenario{
		{
			name: "init --policy-authority",
			prepare: func(t *testing.T, root string) []string {
				return []string{"init", "--signer", key(root), "--policy-authority", authority(t, root), "--cluster", "kill", "--out", filepath.Join(root, "out")}
			},
			keys: keyFiles, op: "init", keyOp: "init.key", cert: certdir.FileCACert, approvals: 1,
		},
		{
			name: "intermediate request --policy-authority",
			prepare: func(t *testing.T, root string) []string {
				return []string{"intermediate", "request", "--signer", key(root), "--policy-authority", authority(t, root), "--name", "node-1", "--out", filepath.Join(root, "out", "issuer.csr")}
			},
			keys: keyFiles, op: "intermediate.request", keyOp: "intermediate.key", approvals: 1, remakes: true,
		},
	}
}

// TestKilledAtEveryStepUnderAuthority is TestKilledAtEveryStep for the
// key-creating commands under a policy authority, against swtpm.
func TestKilledAtEveryStepUnderAuthority(t *testing.T) {
	requireScheme(t, "tpm")
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	for _, sc := range authorityScenarios(sw) {
		t.Run(strings.ReplaceAll(sc.name, " ", "_"), func(t *testing.T) { runKillScenario(t, sc) })
	}
}
