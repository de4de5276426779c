package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestDaemonDependencies keeps the daemon binary lean and its attack
// surface small: it must not link the testing package (test helpers
// leaking into production code), Talos's talosconfig code, any YAML
// parser (it reads only PEM, its flags and the environment) or go-cni,
// and so nothing of the ceremony (keystore/).
func TestDaemonDependencies(t *testing.T) {
	forbidden := []struct{ what, why string }{
		{"testing", "a test helper is linked into the daemon"},
		{"github.com/siderolabs/talos/pkg/machinery/client/config", "talosconfig code is the ceremony's"},
		{"github.com/containerd/go-cni", "CNI is no business of trustd"},
		{"github.com/steward-trustd/steward-trustd/keystore", "the ceremony is not part of the daemon"},
	}
	for _, cgo := range []string{"1", "0"} {
		deps := daemonDeps(t, cgo)
		for _, f := range forbidden {
			if deps[f.what] {
				t.Errorf("CGO_ENABLED=%s: the daemon links %s: %s", cgo, f.what, f.why)
			}
		}
		for d := range deps {
			if strings.Contains(strings.ToLower(d), "yaml") {
				t.Errorf("CGO_ENABLED=%s: the daemon links %s: it reads no YAML", cgo, d)
			}
			if strings.HasPrefix(d, "github.com/steward-trustd/steward-trustd/keystore/") {
				t.Errorf("CGO_ENABLED=%s: the daemon links %s: the ceremony is not part of the daemon", cgo, d)
			}
		}
	}
}

// daemonDeps lists the packages the daemon binary links.
func daemonDeps(t *testing.T, cgo string) map[string]bool {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "github.com/steward-trustd/steward-trustd/cmd/steward-trustd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := map[string]bool{}
	for _, line := range strings.Fields(string(out)) {
		deps[line] = true
	}
	if !deps["github.com/steward-trustd/steward-trustd/server"] {
		t.Fatalf("go list -deps printed no daemon dependencies:\n%s", out)
	}
	return deps
}
