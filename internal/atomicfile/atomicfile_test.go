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

// TestNoNamedTemporary: a write that is interrupted before its file is
// linked (simulated by an unnamed file that is never linked) leaves no
// name behind, and RemoveStaleTemps removes exactly this package's
// temporary names.
func TestNoNamedTemporary(t *testing.T) {
	dir := t.TempDir()
	f, err := openUnnamed(dir, 0o600)
	if err != nil {
		t.Skipf("no O_TMPFILE here: %v", err)
	}
	if _, err := f.Write([]byte("secret key")); err != nil {
		t.Fatal(err)
	}
	f.Close() // as if the process died before linkat
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("an unlinked write left %v", ents)
	}
	for _, n := range []string{".os-ca.key.tmp-123456", ".token.tmp-0a1b2c3d4e5f6071", "keep", ".keep.tmp-", ".x.tmp-zz", "os-ca.key.tmp-1"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := RemoveStaleTemps(dir)
	if err != nil || len(removed) != 2 {
		t.Fatalf("removed %v, %v; want the two temporary files", removed, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 4 {
		t.Errorf("left %v, want the 4 other names", ents)
	}
}

// TestRemoveStaleTempsOf removes the temporary files of one path only:
// another file's temporary in the same directory, and names that only
// look alike, stay.
func TestRemoveStaleTempsOf(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{".ca.tpmkey.creation.json.tmp-1f2e", ".ca.tpmkey.creation.json.tmp-42", ".ca.tpmkey.tmp-99", ".other.json.tmp-7", "ca.tpmkey.creation.json", ".ca.tpmkey.creation.json.tmp-zz"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := RemoveStaleTempsOf(filepath.Join(dir, "ca.tpmkey.creation.json"))
	if err != nil || len(removed) != 2 {
		t.Fatalf("removed %v, %v; want the record's two temporary files", removed, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 4 {
		t.Errorf("left %v, want the 4 other names", ents)
	}
}
