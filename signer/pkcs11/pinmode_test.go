//go:build cgo

package pkcs11

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPINModeWarning: a PIN file that group or others may read is
// warned about, except a Kubernetes Secret projection readable by this
// process's own group (mode 0440 on tmpfs in kubelet's ..data layout),
// whose mode the user cannot change.
func TestPINModeWarning(t *testing.T) {
	plain := filepath.Join(t.TempDir(), "pin")
	if err := os.WriteFile(plain, []byte("1234"), 0o640); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		path string
		warn bool
	}{
		{"plain group-readable file", plain, true},
		{"secret mount 0440 of our group", secretPIN(t), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var logs bytes.Buffer
			b := &Backend{Logger: slog.New(slog.NewTextHandler(&logs, nil))}
			f, err := os.Open(c.path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			b.checkPINMode(c.path, f)
			if got := strings.Contains(logs.String(), "chmod 600"); got != c.warn {
				t.Errorf("warned=%v, want %v:\n%s", got, c.warn, logs.String())
			}
			if strings.Contains(logs.String(), "1234") {
				t.Error("the PIN appears in the log")
			}
		})
	}
}

// secretPIN lays out a PIN file on tmpfs as kubelet's atomic writer does
// for a Secret volume with fsGroup = this process's group.
func secretPIN(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "pin-volume-")
	if err != nil {
		t.Fatalf("/dev/shm (tmpfs) is needed for a Secret-mount layout: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ts := "..2026_12_03_10_00_00.000000001"
	steps := []error{
		os.Mkdir(filepath.Join(dir, ts), 0o755),
		os.WriteFile(filepath.Join(dir, ts, "pin"), []byte("1234"), 0o440),
		os.Chown(filepath.Join(dir, ts, "pin"), os.Geteuid(), os.Getegid()),
		os.Chmod(filepath.Join(dir, ts, "pin"), 0o440),
		os.Symlink(ts, filepath.Join(dir, "..data")),
		os.Symlink("..data/pin", filepath.Join(dir, "pin")),
	}
	for _, err := range steps {
		if err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "pin")
}
