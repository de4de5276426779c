package main

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestContainerdImports hands the layout to a real containerd (Debian's,
// its own root, state and socket in a temporary directory) the way a
// node gets an image offline: `ctr images import` of the layout as a tar,
// which unpacks the layer and checks it against the config's diff_ids.
// containerd refused the image before they were written ("mismatched
// image rootfs and manifest layers").
func TestContainerdImports(t *testing.T) {
	ctr := needContainerd(t)
	out := filepath.Join(t.TempDir(), "image")
	s := spec{out: out, tag: "v0.0.0-test", bins: platformBins{{"linux", "amd64", fakeBins(t)}}, created: time.Unix(0, 0)}
	if err := build(s, io.Discard); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "image.tar")
	tarDir(t, out, archive)
	sock := startContainerd(t)
	cmd := exec.Command(ctr, "--address", sock, "--namespace", "test", "images", "import",
		"--snapshotter", "native", "--base-name", "localhost/steward-trustd", archive)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, b)
	}
	b, err := exec.Command(ctr, "--address", sock, "--namespace", "test", "images", "check").CombinedOutput()
	if err != nil || !strings.Contains(string(b), "localhost/steward-trustd:v0.0.0-test") || !strings.Contains(string(b), "complete") {
		t.Fatalf("ctr images check: %v\n%s", err, b)
	}
}

// needContainerd returns ctr's path, or skips (fails under
// STEWARD_REQUIRE_DEVICES=1, as make test sets it) without root,
// containerd or ctr.
func needContainerd(t *testing.T) string {
	t.Helper()
	_, errD := exec.LookPath("containerd")
	ctr, errC := exec.LookPath("ctr")
	if os.Geteuid() == 0 && errD == nil && errC == nil {
		return ctr
	}
	msg := "needs root and Debian's containerd (hack/deps.sh installs it)"
	if os.Getenv("STEWARD_REQUIRE_DEVICES") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// startContainerd runs containerd with everything under a fresh
// directory and stops it by its PID when the test ends; it returns the
// socket once it exists.
func startContainerd(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "containerd") // socket paths are limited to 108 bytes
	check(t, err)
	sock := filepath.Join(dir, "containerd.sock")
	config := fmt.Sprintf("version = 2\nroot = %q\nstate = %q\n[grpc]\n  address = %q\n", filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock)
	check(t, os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o600))
	log, err := os.Create(filepath.Join(dir, "containerd.log"))
	check(t, err)
	cmd := exec.Command("containerd", "--config", filepath.Join(dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = log, log
	check(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("containerd log:\n%s", b)
		}
		os.RemoveAll(dir)
	})
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			return sock
		}
	}
	t.Fatal("containerd did not create its socket within 30s")
	return ""
}

// tarDir writes dir's tree as a tar archive at path (what `ctr images
// import` reads for an OCI layout).
func tarDir(t *testing.T, dir, path string) {
	t.Helper()
	f, err := os.Create(path)
	check(t, err)
	defer f.Close()
	tw := tar.NewWriter(f)
	check(t, tw.AddFS(os.DirFS(dir)))
	check(t, tw.Close())
}

func check(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
