package file

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/keyutil"
	"github.com/steward-trustd/steward-trustd/signer"
)

// secretVolume lays out name in dir exactly as kubelet's atomic writer
// does for a Secret volume: dir/..<timestamp>/name, dir/..data ->
// ..<timestamp>, dir/name -> ..data/name.
func secretVolume(t *testing.T, dir, name string, key []byte, mode os.FileMode, gid int) string {
	t.Helper()
	ts := "..2026_12_03_10_00_00.123456789"
	must(t, os.Mkdir(filepath.Join(dir, ts), 0o755))
	real := filepath.Join(dir, ts, name)
	must(t, os.WriteFile(real, key, 0o600))
	must(t, os.Chown(real, -1, gid))
	must(t, os.Chmod(real, mode))
	must(t, os.Symlink(ts, filepath.Join(dir, "..data")))
	must(t, os.Symlink("..data"+"/"+name, filepath.Join(dir, name)))
	return filepath.Join(dir, name)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// tmpfsDir returns a fresh directory on tmpfs (/dev/shm), as kubelet uses
// for Secret volumes.
func tmpfsDir(t *testing.T) string {
	t.Helper()
	var sfs syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &sfs); err != nil || sfs.Type != tmpfsMagic {
		t.Fatalf("/dev/shm is not a tmpfs here (%v): the Secret-mount test needs one", err)
	}
	dir, err := os.MkdirTemp("/dev/shm", "secret-volume-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func TestSecretMountMode(t *testing.T) {
	key, err := keyutil.GenerateKey(nil, signer.Ed25519)
	must(t, err)
	pemKey, err := keyutil.MarshalPrivateKeyPEM(key)
	must(t, err)
	own := os.Getegid()
	foreign := 54321 // no process here has this group
	plain := func(dir string, mode os.FileMode, gid int) string {
		p := filepath.Join(dir, "os-ca.key")
		must(t, os.WriteFile(p, pemKey, 0o600))
		must(t, os.Chown(p, -1, gid))
		must(t, os.Chmod(p, mode))
		return p
	}
	layout := func(dir string, mode os.FileMode, gid int) string {
		return secretVolume(t, dir, "os-ca.key", pemKey, mode, gid)
	}
	// The Secret's name links somewhere else than ..data/NAME.
	otherLink := func(dir string, mode os.FileMode, gid int) string {
		p := layout(dir, mode, gid)
		must(t, os.Remove(p))
		must(t, os.Symlink(filepath.Join(dir, "..data", "os-ca.key"), p))
		return p
	}
	tests := []struct {
		name   string
		tmpfs  bool
		make   func(string, os.FileMode, int) string
		mode   os.FileMode
		gid    int
		wantOK bool
		reason string
	}{
		{"plain 0600", false, plain, 0o600, own, true, ""},
		{"Secret, fsGroup 0440", true, layout, 0o440, own, true, ""},
		{"Secret, fsGroup 0640", true, layout, 0o640, own, true, ""},
		{"Secret, others may read", true, layout, 0o444, own, false, "not owner + group read only"},
		{"Secret, group may write", true, layout, 0o460, own, false, "not owner + group read only"},
		{"Secret, group not ours", true, layout, 0o440, foreign, false, "is not this process's group"},
		{"plain 0440 on tmpfs", true, plain, 0o440, own, false, "is not a symlink to ..data/os-ca.key"},
		{"absolute link instead of ..data/NAME", true, otherLink, 0o440, own, false, "is not a symlink to ..data/os-ca.key"},
		{"Secret layout on disk, not tmpfs", false, layout, 0o440, own, false, "not on tmpfs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.gid == foreign && os.Geteuid() != 0 {
				t.Skip("giving a file a foreign group needs root")
			}
			dir := t.TempDir()
			if tc.tmpfs {
				dir = tmpfsDir(t)
			} else if onTmpfs(dir) {
				t.Skipf("%s is itself tmpfs: no disk directory to test the tmpfs rule against", dir)
			}
			p := tc.make(dir, tc.mode, tc.gid)
			var logs bytes.Buffer
			b := &Backend{Logger: slog.New(slog.NewTextHandler(&logs, nil))}
			s, err := b.Open(context.Background(), URI(p))
			if tc.wantOK {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				s.Close()
				if (tc.mode&0o040 != 0) != strings.Contains(logs.String(), "Kubernetes Secret mount") {
					t.Fatalf("want an info line exactly when group read was accepted: %s", logs.String())
				}
				return
			}
			if err == nil {
				t.Fatal("group-readable key accepted")
			}
			for _, want := range []string{"chmod 600 " + p, tc.reason} {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("error %q does not say %q", err, want)
				}
			}
		})
	}
}

// tmpfsMagic is TMPFS_MAGIC from linux/magic.h (statfs(2)).
const tmpfsMagic = 0x01021994

func onTmpfs(dir string) bool {
	var sfs syscall.Statfs_t
	return syscall.Statfs(dir, &sfs) == nil && sfs.Type == tmpfsMagic
}
