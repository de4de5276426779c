package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "key")
	if err := Write(p, []byte("one"), 0o600, false); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", st.Mode().Perm())
	}
	err = Write(p, []byte("two"), 0o600, false)
	if !errors.Is(err, ErrExists) {
		t.Fatalf("second write without overwrite: %v, want ErrExists", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "one" {
		t.Fatalf("content %q after refused overwrite", b)
	}
	if err := Write(p, []byte("three"), 0o644, true); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "three" {
		t.Fatalf("content %q after overwrite", b)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("temporary files left behind: %v", ents)
	}
	if err := Write(filepath.Join(dir, "missing", "x"), nil, 0o600, false); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
}
