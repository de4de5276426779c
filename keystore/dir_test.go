package keystore

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// failingDir fails the write of one named file, to check roll back.
type failingDir struct {
	OSDir
	failOn string
}

var errInjected = errors.New("injected write failure")

func (d failingDir) WriteFile(name string, data []byte, perm fs.FileMode, overwrite bool) error {
	if name == d.failOn {
		return errInjected
	}
	return d.OSDir.WriteFile(name, data, perm, overwrite)
}

func TestWriteSet(t *testing.T) {
	set := []File{
		{Name: "a", Data: []byte("new a"), Mode: 0o600},
		{Name: "b", Data: []byte("new b"), Mode: 0o644},
		{Name: "sub/c", Data: []byte("new c"), Mode: 0o600},
	}
	tests := []struct {
		name      string
		existing  map[string]string
		overwrite bool
		failOn    string
		wantErr   error
		want      map[string]string // file -> content after; "" = absent
	}{
		{"fresh", nil, false, "", nil, map[string]string{"a": "new a", "b": "new b", "sub/c": "new c"}},
		{"refuses any existing", map[string]string{"b": "old b"}, false, "", ErrExists, map[string]string{"a": "", "b": "old b", "sub/c": ""}},
		{"overwrite", map[string]string{"b": "old b"}, true, "", nil, map[string]string{"a": "new a", "b": "new b", "sub/c": "new c"}},
		{"failure removes new files", nil, false, "sub/c", errInjected, map[string]string{"a": "", "b": "", "sub/c": ""}},
		{"failure restores replaced files", map[string]string{"a": "old a"}, true, "b", errInjected, map[string]string{"a": "old a", "b": "", "sub/c": ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			writeFiles(t, root, tt.existing)
			var d Dir = OSDir{Root: root}
			if tt.failOn != "" {
				d = failingDir{OSDir: OSDir{Root: root}, failOn: tt.failOn}
			}
			err := WriteSet(d, set, tt.overwrite)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("WriteSet error %v, want %v", err, tt.wantErr)
			}
			checkContents(t, root, tt.want)
			if tt.wantErr == nil {
				st, err := os.Stat(filepath.Join(root, "b"))
				if err != nil || st.Mode().Perm() != 0o644 {
					t.Errorf("b mode %v (%v), want 0644", st.Mode(), err)
				}
			}
			checkNoTempFiles(t, root)
		})
	}
}

// writeFiles creates each file of files (name -> content) under root.
func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for n, c := range files {
		if err := os.WriteFile(filepath.Join(root, n), []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// checkContents checks each file of want (name -> content; "" = absent)
// under root.
func checkContents(t *testing.T, root string, want map[string]string) {
	t.Helper()
	for n, w := range want {
		got, err := os.ReadFile(filepath.Join(root, n))
		if w == "" {
			if !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s exists (%q), want absent", n, got)
			}
			continue
		}
		if err != nil || string(got) != w {
			t.Errorf("%s = %q (%v), want %q", n, got, err, w)
		}
	}
}

// checkNoTempFiles fails if an atomic write left a temporary file under
// root.
func checkNoTempFiles(t *testing.T, root string) {
	t.Helper()
	_ = filepath.WalkDir(root, func(p string, e fs.DirEntry, _ error) error {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file left: %s", p)
		}
		return nil
	})
}

func TestOSDirRejectsEscapes(t *testing.T) {
	d := OSDir{Root: t.TempDir()}
	for _, n := range []string{"../x", "/abs", "a/../../b", ""} {
		if err := d.WriteFile(n, []byte("x"), 0o600, false); err == nil {
			t.Errorf("WriteFile(%q) succeeded", n)
		}
	}
}
