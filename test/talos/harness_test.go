// Package talos runs steward-trustd against Talos's own worker code: the
// CSR comes from siderolabs/crypto (as machined builds it) and the request
// goes through pkg/grpc/gen.RemoteGenerator (as a worker sends it). It is a
// separate module so that the product never links the Talos tree.
package talos

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
)

// binDir holds the binaries built once by TestMain.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := devtest.BuildBinaries(filepath.Join("..", ".."), "./cmd/steward-trustd", "./cmd/steward-trustd-gencreds", "./cmd/steward-trustd-ceremony")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// The authorizer is its own module (client-go stays out of the
	// daemon's graph), so the build above does not make it.
	auth := exec.Command("go", "build", "-o", dir+string(filepath.Separator), ".")
	auth.Dir = filepath.Join("..", "..", "cmd", "steward-trustd-authorizer")
	auth.Stdout, auth.Stderr = os.Stderr, os.Stderr
	if err := auth.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build steward-trustd-authorizer:", err)
		return 1
	}
	binDir = dir
	return m.Run()
}

// gencreds writes file credentials into a fresh directory.
func gencreds(t testing.TB, args ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	out, err := exec.Command(filepath.Join(binDir, "steward-trustd-gencreds"), append([]string{"-cluster", "e2e", "-output", dir}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("gencreds: %v\n%s", err, out)
	}
	return dir
}

// daemon is a running steward-trustd.
type daemon = devtest.Daemon

// startDaemon runs steward-trustd with env on a free loopback port and
// waits until it listens.
func startDaemon(t testing.TB, env ...string) *daemon {
	t.Helper()
	return devtest.StartDaemon(t, filepath.Join(binDir, "steward-trustd"), env...)
}

func freePort(t testing.TB) int { return devtest.FreePort(t) }

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func removeFile(path string) error { return os.Remove(path) }

// ceremony runs steward-trustd-ceremony with env added to ours.
func ceremony(t testing.TB, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "steward-trustd-ceremony"), args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ceremony %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// get fetches url and returns the status code (0 when unreachable).
func get(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// eventually polls cond every 200ms until it holds or d passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
