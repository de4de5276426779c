// Package devtest holds what the end-to-end tests share: the rule for
// when tests that need swtpm or SoftHSMv2 must run instead of skipping,
// and building the binaries once for tests that run them.
package devtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Required reports whether device tests must run: in CI (CI=true) and
// under `make test` (STEWARD_REQUIRE_DEVICES=1) a missing swtpm or
// SoftHSMv2 is a failure, elsewhere a skip.
func Required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("STEWARD_REQUIRE_DEVICES") == "1"
}

// NeedTool returns the path of tool, failing tb (when Required) or
// skipping it when tool is not on PATH.
func NeedTool(tb testing.TB, tool string) string {
	tb.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		if Required() {
			tb.Fatalf("%s is required (CI=true or STEWARD_REQUIRE_DEVICES=1) but not installed (make deps): %v", tool, err)
		}
		tb.Skipf("%s not installed (make deps) and neither CI nor make test asked for it; skipping", tool)
	}
	return p
}

// BuildBinaries builds the main packages pkgs (e.g. "./cmd/steward-trustd")
// of the module rooted at root into a new temporary directory, which the
// caller removes.
func BuildBinaries(root string, pkgs ...string) (string, error) {
	dir, err := os.MkdirTemp("", "steward-trustd-e2e-bin-")
	if err != nil {
		return "", err
	}
	build := exec.Command("go", append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)...)
	build.Dir = root
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("build %v: %w", pkgs, err)
	}
	return dir, nil
}
