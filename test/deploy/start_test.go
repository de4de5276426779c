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
)

// TestFileOverlayStartsOnSecretMount runs the daemon as the rendered file
// overlay runs it: its environment, its runAsUser/runAsGroup and fsGroup
// as the process's credentials, and the gencreds Secret laid out as
// kubelet lays out a Secret volume with that fsGroup and defaultMode (on
// tmpfs, NAME -> ..data/NAME, files root:fsGroup with group read added).
// The daemon must start and turn ready; the mount path is moved to a
// temporary directory (the only change to the overlay's settings, besides
// loopback ports).
func TestFileOverlayStartsOnSecretMount(t *testing.T) {
	if os.Geteuid() != 0 {
		if devtest.Required() {
			t.Fatal("this test runs the daemon as the pod's uid and gives files the pod's fsGroup, which needs root (CI runs as root)")
		}
		t.Skip("needs root to act as kubelet and run as the pod's uid")
	}
	setpriv := devtest.NeedTool(t, "setpriv")
	bins, err := devtest.BuildBinaries(repoRoot, "./cmd/steward-trustd", "./cmd/steward-trustd-gencreds")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bins) })
	d := only[*appsv1.Deployment](t, render(t, "overlays/file"))
	pod := &d.Spec.Template.Spec
	c := &pod.Containers[0]
	creds := filepath.Join(t.TempDir(), "creds")
	if out, err := exec.Command(filepath.Join(bins, "steward-trustd-gencreds"), "-cluster", env(c, "TRUSTD_TENANT"), "-output", creds).CombinedOutput(); err != nil {
		t.Fatalf("gencreds: %v\n%s", err, out)
	}
	mount, vol := certsMount(t, pod, c)
	secret := decodeSecret(t, filepath.Join(creds, "kubernetes-secret.yaml"))
	if secret.Name != vol.Secret.SecretName {
		t.Fatalf("the overlay mounts Secret %s, gencreds -cluster %s makes %s", vol.Secret.SecretName, env(c, "TRUSTD_TENANT"), secret.Name)
	}
	dir := kubeletSecretVolume(t, secret, *vol.Secret.DefaultMode, *pod.SecurityContext.FSGroup)

	health := fmt.Sprintf("127.0.0.1:%d", devtest.FreePort(t))
	environ := []string{"TRUSTD_HEALTH_ADDR=" + health}
	for _, e := range c.Env {
		if e.Name != "TRUSTD_HEALTH_ADDR" {
			environ = append(environ, e.Name+"="+strings.ReplaceAll(e.Value, mount.MountPath, dir))
		}
	}
	sc := pod.SecurityContext
	run := filepath.Join(t.TempDir(), "run-as-pod")
	script := fmt.Sprintf("#!/bin/sh\nexec %s --reuid=%d --regid=%d --groups=%d %s\n", setpriv, *sc.RunAsUser, *sc.RunAsGroup, *sc.FSGroup, filepath.Join(bins, "steward-trustd"))
	if err := os.WriteFile(run, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	daemon := devtest.StartDaemon(t, run, environ...)
	if !strings.Contains(daemon.Logs(), "Kubernetes Secret mount") {
		t.Fatalf("the file signer did not report accepting the Secret mount\n%s", daemon.Logs())
	}
	waitReady(t, "http://"+health+"/readyz", daemon)
}

// certsMount is the mount and Secret volume holding TRUSTD_CERT_DIR.
func certsMount(t *testing.T, pod *corev1.PodSpec, c *corev1.Container) (corev1.VolumeMount, corev1.Volume) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath != env(c, "TRUSTD_CERT_DIR") {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.Secret != nil && v.Secret.DefaultMode != nil {
				return m, v
			}
		}
	}
	t.Fatal("TRUSTD_CERT_DIR is not a Secret volume mount with a defaultMode")
	return corev1.VolumeMount{}, corev1.Volume{}
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
