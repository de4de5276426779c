// Package talos runs steward-trustd against Talos's own worker code: the
// CSR comes from siderolabs/crypto (as machined builds it) and the request
// goes through pkg/grpc/gen.RemoteGenerator (as a worker sends it). It is a
// separate module so that the product never links the Talos tree.
package talos

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
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
type daemon struct {
	cmd  *exec.Cmd
	addr string
	logs *lockedBuffer
	done chan error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startDaemon runs steward-trustd on a free loopback port with env added
// to a clean environment, and waits until it listens.
func startDaemon(t testing.TB, env ...string) *daemon {
	t.Helper()
	port := freePort(t)
	cmd := exec.Command(filepath.Join(binDir, "steward-trustd"))
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"TRUSTD_LISTEN_ADDRESS=127.0.0.1",
		fmt.Sprintf("TRUSTD_PORT=%d", port),
	}, env...)
	d := &daemon{cmd: cmd, addr: fmt.Sprintf("127.0.0.1:%d", port), logs: &lockedBuffer{}, done: make(chan error, 1)}
	pr, pw := io.Pipe()
	cmd.Stdout = d.logs
	cmd.Stderr = io.MultiWriter(d.logs, pw)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		once := sync.Once{}
		for sc.Scan() {
			if strings.Contains(sc.Text(), "steward-trustd listening") {
				once.Do(func() { close(listening) })
			}
		}
	}()
	go func() { d.done <- cmd.Wait(); pw.Close() }()
	t.Cleanup(func() { d.stop(t) })
	select {
	case <-listening:
	case err := <-d.done:
		t.Fatalf("daemon exited before listening: %v\n%s", err, d.logs.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("daemon did not listen within 60s\n%s", d.logs.String())
	}
	return d
}

// stop sends SIGTERM and waits for a clean exit.
func (d *daemon) stop(t testing.TB) {
	if d.cmd.ProcessState != nil {
		return
	}
	_ = d.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-d.done:
		d.done <- err
		if err != nil && !strings.Contains(err.Error(), "signal") {
			t.Errorf("daemon exit: %v\n%s", err, d.logs.String())
		}
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		t.Errorf("daemon did not stop within 20s of SIGINT\n%s", d.logs.String())
	}
}

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
