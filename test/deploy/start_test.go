package deploy

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11/softhsm"
)

// podRun is a rendered overlay's pod about to run on this machine: each
// volume mount path maps to a host directory laid out as kubelet would.
type podRun struct {
	bins   string
	pod    *corev1.PodSpec
	c      *corev1.Container
	mounts map[string]string // mountPath → host directory
}

func newPodRun(t *testing.T, overlay string) *podRun {
	t.Helper()
	if os.Geteuid() != 0 {
		if devtest.Required() {
			t.Fatal("this test runs the daemon as the pod's uid and gives files the pod's fsGroup, which needs root (CI runs as root)")
		}
		t.Skip("needs root to act as kubelet and run as the pod's uid")
	}
	bins, err := devtest.BuildBinaries(repoRoot, "./cmd/steward-trustd", "./cmd/steward-trustd-gencreds", "./cmd/steward-trustd-ceremony")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bins) })
	d := only[*appsv1.Deployment](t, render(t, overlay))
	pod := &d.Spec.Template.Spec
	return &podRun{bins: bins, pod: pod, c: &pod.Containers[0], mounts: map[string]string{}}
}

// secretVolume mounts secret as kubelet would at the mount of volume name
// (checking that the pod mounts the Secret it names).
func (p *podRun) secretVolume(t *testing.T, name string, secret *corev1.Secret) {
	t.Helper()
	m, v := p.mount(t, name)
	if v.Secret == nil || v.Secret.DefaultMode == nil || v.Secret.SecretName != secret.Name {
		t.Fatalf("volume %s: want a Secret volume of %s with a defaultMode, got %+v", name, secret.Name, v.VolumeSource)
	}
	p.mounts[m.MountPath] = kubeletSecretVolume(t, secret, *v.Secret.DefaultMode, *p.pod.SecurityContext.FSGroup)
}

// mount is the container's mount of volume name and the volume.
func (p *podRun) mount(t *testing.T, name string) (corev1.VolumeMount, corev1.Volume) {
	t.Helper()
	m := mountNamed(p.c, name)
	if m == nil {
		t.Fatalf("no mount of volume %s", name)
	}
	for _, v := range p.pod.Volumes {
		if v.Name == name {
			return *m, v
		}
	}
	t.Fatalf("no volume %s", name)
	return corev1.VolumeMount{}, corev1.Volume{}
}

// start runs the daemon as the pod's runAsUser, runAsGroup and fsGroup
// with the container's environment, mount paths moved to their host
// directories, loopback ports, and extra; it waits for /readyz.
func (p *podRun) start(t *testing.T, extra ...string) *devtest.Daemon {
	t.Helper()
	health := fmt.Sprintf("127.0.0.1:%d", devtest.FreePort(t))
	environ := append([]string{"TRUSTD_HEALTH_ADDR=" + health}, extra...)
	for _, e := range p.c.Env {
		if e.Name != "TRUSTD_HEALTH_ADDR" {
			environ = append(environ, e.Name+"="+p.remap(e.Value))
		}
	}
	sc := p.pod.SecurityContext
	run := filepath.Join(t.TempDir(), "run-as-pod")
	script := fmt.Sprintf("#!/bin/sh\nexec %s --reuid=%d --regid=%d --groups=%d %s\n", devtest.NeedTool(t, "setpriv"),
		*sc.RunAsUser, *sc.RunAsGroup, *sc.FSGroup, filepath.Join(p.bins, "steward-trustd"))
	check(t, os.WriteFile(run, []byte(script), 0o755))
	d := devtest.StartDaemon(t, run, environ...)
	waitReady(t, "http://"+health+"/readyz", d)
	return d
}

func (p *podRun) remap(v string) string {
	for mountPath, host := range p.mounts {
		v = strings.ReplaceAll(v, mountPath, host)
	}
	return v
}

// TestFileOverlayStartsOnSecretMount: the file overlay with the gencreds
// Secret as kubelet mounts it (fsGroup, defaultMode): the file signer
// accepts the key and the daemon turns ready.
func TestFileOverlayStartsOnSecretMount(t *testing.T) {
	p := newPodRun(t, "overlays/file")
	creds := filepath.Join(t.TempDir(), "creds")
	if out, err := exec.Command(filepath.Join(p.bins, "steward-trustd-gencreds"), "-cluster", env(p.c, "TRUSTD_TENANT"), "-output", creds).CombinedOutput(); err != nil {
		t.Fatalf("gencreds: %v\n%s", err, out)
	}
	p.secretVolume(t, "certs", decodeSecret(t, filepath.Join(creds, "kubernetes-secret.yaml")))
	d := p.start(t)
	if !strings.Contains(d.Logs(), "Kubernetes Secret mount") {
		t.Fatalf("the file signer did not report accepting the Secret mount\n%s", d.Logs())
	}
}

// TestPKCS11OverlayStarts: the pkcs11 overlay exactly as shipped — its
// token, object, module file name, PIN path and LD_LIBRARY_PATH — with
// SoftHSMv2 as the vendor's module (libvendor.so in the module volume),
// the ceremony Secret and the PIN Secret as kubelet mounts them.
func TestPKCS11OverlayStarts(t *testing.T) {
	p := newPodRun(t, "overlays/pkcs11")
	devtest.NeedTool(t, "softhsm2-util")
	uri, err := pkcs11.ParseURI(env(p.c, "TRUSTD_SIGNER"))
	check(t, err)
	tok, err := softhsm.New(podReadableDir(t), uri.Token)
	check(t, err)
	modMount, _ := p.mount(t, "hsm-module")
	modDir := podReadableDir(t)
	p.mounts[modMount.MountPath] = modDir
	check(t, os.MkdirAll(filepath.Dir(p.remap(uri.ModulePath)), 0o755))
	b, err := os.ReadFile(tok.ModulePath)
	check(t, err)
	check(t, os.WriteFile(p.remap(uri.ModulePath), b, 0o755))

	certs := filepath.Join(t.TempDir(), "ceremony")
	ceremonyURI := strings.NewReplacer(uri.ModulePath, tok.ModulePath, uri.PINSource, tok.PINFile).Replace(env(p.c, "TRUSTD_SIGNER"))
	cmd := exec.Command(filepath.Join(p.bins, "steward-trustd-ceremony"), "init", "--signer", ceremonyURI, "--cluster", env(p.c, "TRUSTD_TENANT"), "--out", certs)
	cmd.Env = append(os.Environ(), tok.Env())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ceremony init: %v\n%s", err, out)
	}
	chownTree(t, tok.Dir, int(*p.pod.SecurityContext.RunAsUser))
	p.secretVolume(t, "certs", decodeSecret(t, filepath.Join(certs, "kubernetes-secret.yaml")))
	pinMount, pinVol := p.mount(t, "hsm-pin")
	if filepath.Dir(uri.PINSource) != pinMount.MountPath {
		t.Fatalf("pin-source %s is not a file of the PIN Secret's mount %s", uri.PINSource, pinMount.MountPath)
	}
	pinSecret := &corev1.Secret{Data: map[string][]byte{filepath.Base(uri.PINSource): []byte(tok.PIN + "\n")}}
	pinSecret.Name = pinVol.Secret.SecretName
	p.secretVolume(t, "hsm-pin", pinSecret)
	d := p.start(t, tok.Env())
	if !strings.Contains(d.Logs(), `"backend":"pkcs11"`) || strings.Contains(d.Logs(), tok.PIN) {
		t.Fatalf("want the pkcs11 key opened and the PIN never logged\n%s", d.Logs())
	}
}

// podReadableDir is a fresh directory the pod's uid can reach (a
// t.TempDir's parent is private to root).
func podReadableDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pod-volume-")
	check(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	check(t, os.Chmod(dir, 0o755))
	return dir
}

// chownTree gives dir and everything below to uid (the token is the
// pod's, as on a volume it owns).
func chownTree(t *testing.T, dir string, uid int) {
	t.Helper()
	err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
	check(t, err)
}

func decodeSecret(t *testing.T, path string) *corev1.Secret {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	obj, _, err := strictDecoder(t).Decode(b, nil, nil)
	if err != nil {
		t.Fatalf("%s does not decode strictly as a Secret: %v", path, err)
	}
	s, ok := obj.(*corev1.Secret)
	if !ok {
		t.Fatalf("%s is a %T", path, obj)
	}
	return s
}

// kubeletSecretVolume writes secret as kubelet does on a tmpfs volume:
// ..<timestamp>/KEY files with defaultMode, ..data -> ..<timestamp>,
// KEY -> ..data/KEY, then (fsGroup set, read-only volume) every file
// chowned to group fsGroup with group read added (kubelet's
// SetVolumeOwnership: mode | 0440).
func kubeletSecretVolume(t *testing.T, secret *corev1.Secret, mode int32, fsGroup int64) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "secret-volume-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(dir, &sfs); err != nil || sfs.Type != 0x01021994 {
		t.Fatalf("/dev/shm is not tmpfs (%v): kubelet's Secret volumes are", err)
	}
	ts := "..2026_12_03_10_00_00.000000001"
	check(t, os.Chmod(dir, 0o755))
	check(t, os.Mkdir(filepath.Join(dir, ts), 0o755))
	for name, data := range secret.Data {
		p := filepath.Join(dir, ts, name)
		check(t, os.WriteFile(p, data, 0o600))
		check(t, os.Chown(p, 0, int(fsGroup)))
		check(t, os.Chmod(p, os.FileMode(mode)|0o440))
		check(t, os.Symlink("..data/"+name, filepath.Join(dir, name)))
	}
	check(t, os.Chown(filepath.Join(dir, ts), 0, int(fsGroup)))
	check(t, os.Symlink(ts, filepath.Join(dir, "..data")))
	return dir
}

func check(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func waitReady(t *testing.T, url string, d *devtest.Daemon) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s not ready within 30s\n%s", url, d.Logs())
}
