package deploy

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
)

// podRun is a rendered layout's pod about to run on this machine: each
// volume mount path maps to a host directory laid out as kubelet would,
// and the node's devices to what stands in for them here.
type podRun struct {
	bins    string
	pod     *corev1.PodSpec
	c       *corev1.Container
	mounts  map[string]string // mountPath → host directory
	devices map[string]string // key URI attribute on the node → here (swtpm)
	site    map[string]string // site values the layout says to replace: name → value
}

func newPodRun(t *testing.T, bins, overlay string) *podRun {
	t.Helper()
	d := only[*appsv1.Deployment](t, render(t, overlay))
	return newPodRunOf(bins, &d.Spec.Template.Spec)
}

// newPodRunOf runs pod's first container as kubelet would, with the
// commands in bins.
func newPodRunOf(bins string, pod *corev1.PodSpec) *podRun {
	return &podRun{bins: bins, pod: pod, c: &pod.Containers[0], mounts: map[string]string{}, devices: map[string]string{}, site: map[string]string{}}
}

// podBinaries builds the daemon, gencreds and the ceremony once for a
// test that runs them as kubelet would (which needs root).
func podBinaries(t *testing.T) string {
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
	return bins
}

// secretVolume mounts secret as kubelet would at the mount of volume name
// (checking that the pod mounts the Secret it names).
func (p *podRun) secretVolume(t *testing.T, name string, secret *corev1.Secret) {
	t.Helper()
	m, v := p.mount(t, name)
	if v.Secret == nil || v.Secret.DefaultMode == nil || v.Secret.SecretName != secret.Name {
		t.Fatalf("volume %s: want a Secret volume of %s with a defaultMode, got %+v", name, secret.Name, v.VolumeSource)
	}
	var fsGroup *int64
	if p.pod.SecurityContext != nil {
		fsGroup = p.pod.SecurityContext.FSGroup
	}
	p.mounts[m.MountPath] = kubeletSecretVolume(t, secret, *v.Secret.DefaultMode, fsGroup)
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

// start runs the daemon as the pod's (or the container's) runAsUser and
// runAsGroup with fsGroup as a supplementary group, with the container's
// environment as kubelet gives it (the downward API's spec.nodeName,
// $(VAR) references expanded), site values replaced, mount paths moved to
// their host directories, loopback ports, and extra; it waits for /readyz.
func (p *podRun) start(t *testing.T, extra ...string) *devtest.Daemon {
	t.Helper()
	health := fmt.Sprintf("127.0.0.1:%d", devtest.FreePort(t))
	environ := append([]string{"TRUSTD_HEALTH_ADDR=" + health}, extra...)
	for _, kv := range p.environ(t) {
		if !strings.HasPrefix(kv, "TRUSTD_HEALTH_ADDR=") {
			environ = append(environ, p.remap(kv))
		}
	}
	uid, gid, groups := p.credentials(t)
	run := filepath.Join(t.TempDir(), "run-as-pod")
	script := fmt.Sprintf("#!/bin/sh\nexec %s --reuid=%d --regid=%d --groups=%d %s\n", devtest.NeedTool(t, "setpriv"),
		uid, gid, groups, filepath.Join(p.bins, "steward-trustd"))
	check(t, os.WriteFile(run, []byte(script), 0o755))
	d := devtest.StartDaemon(t, run, environ...)
	waitReady(t, "http://"+health+"/readyz", d)
	return d
}

// environ is the container's environment as kubelet sets it, on node
// sampleNode, with p.site's values in place of the shipped ones.
func (p *podRun) environ(t *testing.T) []string {
	t.Helper()
	defined := map[string]string{}
	var out []string
	for _, e := range p.c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
				t.Fatalf("env %s: only the downward API's spec.nodeName is supported here", e.Name)
			}
			v = sampleNode
		}
		if site, ok := p.site[e.Name]; ok {
			v = site
		}
		// Kubernetes expands $(VAR) from earlier entries only.
		for name, val := range defined {
			v = strings.ReplaceAll(v, "$("+name+")", val)
		}
		defined[e.Name] = v
		out = append(out, e.Name+"="+v)
	}
	return out
}

// credentials are the uid, gid and supplementary group the container runs
// with: the container's securityContext over the pod's; the group is
// fsGroup when set, else the gid.
func (p *podRun) credentials(t *testing.T) (uid, gid, group int64) {
	t.Helper()
	var u, g, fs *int64
	if sc := p.pod.SecurityContext; sc != nil {
		u, g, fs = sc.RunAsUser, sc.RunAsGroup, sc.FSGroup
	}
	if sc := p.c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			u = sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			g = sc.RunAsGroup
		}
	}
	if u == nil || g == nil {
		t.Fatal("the layout sets no runAsUser/runAsGroup")
	}
	if fs == nil {
		fs = g
	}
	return *u, *g, *fs
}

func (p *podRun) remap(v string) string {
	for mountPath, host := range p.mounts {
		v = strings.ReplaceAll(v, mountPath, host)
	}
	for node, here := range p.devices {
		v = strings.ReplaceAll(v, node, here)
	}
	return v
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
// SetVolumeOwnership: mode | 0440); without fsGroup root:root, defaultMode.
func kubeletSecretVolume(t *testing.T, secret *corev1.Secret, mode int32, fsGroup *int64) string {
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
	group, perm := 0, os.FileMode(mode)
	if fsGroup != nil {
		group, perm = int(*fsGroup), perm|0o440
	}
	for name, data := range secret.Data {
		p := filepath.Join(dir, ts, name)
		check(t, os.WriteFile(p, data, 0o600))
		check(t, os.Chown(p, 0, group))
		check(t, os.Chmod(p, perm))
		check(t, os.Symlink("..data/"+name, filepath.Join(dir, name)))
	}
	check(t, os.Chown(filepath.Join(dir, ts), 0, group))
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
