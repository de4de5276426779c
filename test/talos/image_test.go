package talos

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11/softhsm"
)

// imageUID is the image's user (distroless "nonroot").
const imageUID = 65532

// buildImage runs the image builder (hack/image, `make image`) on the
// binaries TestMain built and returns the OCI layout directory.
func buildImage(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "image")
	cmd := exec.Command("go", "run", ".", "-out", out, "-tag", "e2e", "-bin", "linux/"+runtime.GOARCH+"="+binDir)
	cmd.Dir = filepath.Join("..", "..", "hack", "image")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("image builder: %v\n%s", err, b)
	}
	t.Logf("%s", b)
	return out
}

// TestImage unpacks the image the builder makes and runs the daemon from
// the unpacked root filesystem alone (chroot, as the image's user, no
// /proc, /dev or host library), with the OS CA key on a SoftHSMv2 token
// whose module is loaded from a module directory beside the image, as the
// pkcs11 Kubernetes overlay mounts it. Talos's worker code gets a
// certificate.
func TestImage(t *testing.T) {
	devtest.NeedTool(t, "softhsm2-util")
	chroot := devtest.NeedTool(t, "chroot")
	if os.Geteuid() != 0 {
		if devtest.Required() {
			t.Fatal("the image test runs the daemon under chroot, which needs root (CI runs as root)")
		}
		t.Skip("the image test needs root for chroot")
	}
	layout := buildImage(t)
	man := platformManifest(t, layout, "e2e", runtime.GOARCH)
	var cfg ociConfig
	readBlob(t, layout, man.Config, &cfg)
	if cfg.Config.User != "65532:65532" || len(cfg.Config.Entrypoint) != 1 || cfg.Architecture != runtime.GOARCH {
		t.Fatalf("image config: %+v", cfg)
	}
	root := filepath.Join(t.TempDir(), "rootfs")
	unpackLayers(t, layout, man, root)
	checkRootfs(t, root)
	// The authorizer container of deploy/kubernetes/components/authorizer
	// runs this image's second command as the same user.
	if b, err := exec.Command(chroot, fmt.Sprintf("--userspec=%d:%d", imageUID, imageUID), root, "/usr/local/bin/steward-trustd-authorizer", "--version").CombinedOutput(); err != nil {
		t.Fatalf("the image's authorizer does not run: %v\n%s", err, b)
	}

	tok, err := softhsm.New(t.TempDir(), "trustd")
	if err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(t.TempDir(), "ceremony")
	ceremony(t, []string{tok.Env()}, "init", "--signer", tok.URI("os-ca", []byte{1}), "--cluster", "e2e", "--out", certs)
	moduleDir := installModule(t, root, tok.ModulePath)
	// What the pods' volumes hold: the ceremony Secret, the token, the PIN.
	copyTree(t, certs, filepath.Join(root, "etc/steward-trustd/certs"))
	copyTree(t, tok.Dir, filepath.Join(root, tok.Dir))
	module := filepath.Join(moduleDir, filepath.Base(tok.ModulePath))
	uri := fmt.Sprintf("pkcs11:token=trustd;object=os-ca?module-path=%s&pin-source=file:%s", module, tok.PINFile)

	run := filepath.Join(t.TempDir(), "run-image")
	script := fmt.Sprintf("#!/bin/sh\nexec %s --userspec=%d:%d --groups=%d %s %s\n", chroot, imageUID, imageUID, imageUID, root, cfg.Config.Entrypoint[0])
	if err := os.WriteFile(run, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	d := devtest.StartDaemon(t, run,
		"TRUSTD_CERT_DIR=/etc/steward-trustd/certs",
		"TRUSTD_SIGNER="+uri,
		"SOFTHSM2_CONF="+tok.ConfPath,
		"LD_LIBRARY_PATH="+moduleDir,
		"TRUSTD_PEER_RATE=-1",
	)
	if !strings.Contains(d.Logs(), `"backend":"pkcs11"`) || !strings.Contains(d.Logs(), `"extractable":false`) {
		t.Fatalf("daemon in the image did not open the SoftHSM key\n%s", d.Logs())
	}
	token := strings.TrimSpace(string(readFile(t, filepath.Join(certs, "token"))))
	caPEM := readFile(t, filepath.Join(certs, "os-ca.crt"))
	ca, crt, id, err := workerRequest(t, d.Addr, token, caPEM, csrFromCA, 30*time.Second)
	if err != nil {
		t.Fatalf("Talos worker against the image: %v\n%s", err, d.Logs())
	}
	checkIssued(t, ca, crt, id, [][]byte{caPEM})
}

// imageLibDir is where the image keeps shared libraries (Debian multiarch).
func imageLibDir() string {
	if runtime.GOARCH == "arm64" {
		return "/lib/aarch64-linux-gnu"
	}
	return "/lib/x86_64-linux-gnu"
}

// checkRootfs: the binaries, their loader and libraries, the C++ runtime
// for PKCS#11 modules, three /etc files, and nothing else (no shell).
func checkRootfs(t *testing.T, root string) {
	t.Helper()
	for _, want := range []string{"usr/local/bin/steward-trustd", "usr/local/bin/steward-trustd-ceremony", "usr/local/bin/steward-trustd-gencreds", "usr/local/bin/steward-trustd-authorizer",
		imageLibDir()[1:] + "/libc.so.6", imageLibDir()[1:] + "/libstdc++.so.6", imageLibDir()[1:] + "/libgcc_s.so.1"} {
		if _, err := os.Stat(filepath.Join(root, want)); err != nil {
			t.Errorf("image lacks /%s: %v", want, err)
		}
	}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		rel := "/" + strings.TrimPrefix(p, root+"/")
		if !strings.HasPrefix(rel, "/usr/local/bin/") && !strings.HasPrefix(rel, imageLibDir()+"/") && !strings.HasPrefix(rel, "/lib64/") &&
			!strings.HasPrefix(rel, "/lib/ld-linux") && rel != "/etc/passwd" && rel != "/etc/group" && rel != "/etc/nsswitch.conf" {
			t.Errorf("unexpected file in the image: %s", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// installModule puts the PKCS#11 module and the libraries it needs that
// the image does not have (SoftHSM: OpenSSL's libcrypto) into /opt/hsm/lib
// of root, as a vendor's module volume would hold them, and returns that
// directory as the daemon sees it.
func installModule(t *testing.T, root, module string) string {
	t.Helper()
	const dir = "/opt/hsm/lib"
	dst := filepath.Join(root, dir)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, module, filepath.Join(dst, filepath.Base(module)), 0o755)
	queue := []string{module}
	for len(queue) > 0 {
		f, err := elf.Open(queue[0])
		if err != nil {
			t.Fatal(err)
		}
		needed, err := f.ImportedLibraries()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		queue = queue[1:]
		for _, n := range needed {
			if exists(filepath.Join(root, imageLibDir(), n)) || exists(filepath.Join(dst, n)) {
				continue
			}
			host := filepath.Join(imageLibDir(), n)
			copyFile(t, host, filepath.Join(dst, n), 0o755)
			t.Logf("module volume: %s (not in the image)", n)
			queue = append(queue, host)
		}
	}
	return dir
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}

// copyTree copies the directory src to dst (created with parents), files
// and directories owned by the image's user as a volume would present them.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		target := filepath.Join(dst, strings.TrimPrefix(p, src))
		switch {
		case fi.IsDir():
			err = os.MkdirAll(target, fi.Mode().Perm())
		case fi.Mode().IsRegular():
			copyFile(t, p, target, fi.Mode().Perm())
		default:
			return fmt.Errorf("%s: not a file or directory", p)
		}
		if err != nil {
			return err
		}
		return os.Lchown(target, imageUID, imageUID)
	})
	if err != nil {
		t.Fatal(err)
	}
}
