package tpmpolicy

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestNoDeviceAccess keeps this package pure: it must not import go-tpm's
// transport (how commands reach a TPM) itself, and nothing of the project
// that talks to a device (the backend, tpmsim, tpmdev) may be among its
// dependencies. go-tpm's tpm2 package itself links tpm2/transport (its
// Execute methods take a transport.TPM), so that one indirect dependency
// is the only way a TPM could be reached, and this package calls no
// Execute: the direct-import check is what holds it.
func TestNoDeviceAccess(t *testing.T) {
	t.Parallel()
	direct := goList(t, "{{join .Imports \"\\n\"}}", ".")
	if slices.Contains(direct, "github.com/google/go-tpm/tpm2/transport") {
		t.Error("tpmpolicy imports go-tpm's tpm2/transport: device access belongs in the backend (signer/tpm)")
	}
	for _, dep := range goList(t, "", "-deps", ".") {
		rest, ok := strings.CutPrefix(dep, "github.com/steward-trustd/steward-trustd/")
		if ok && rest != "signer" && rest != "signer/tpm/tpmpolicy" {
			t.Errorf("tpmpolicy depends on %s: only the signer interface package is allowed", dep)
		}
	}
}

func goList(t *testing.T, format string, args ...string) []string {
	t.Helper()
	cmd := []string{"list"}
	if format != "" {
		cmd = append(cmd, "-f", format)
	}
	out, err := exec.Command("go", append(cmd, args...)...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	return strings.Fields(string(out))
}
