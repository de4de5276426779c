// Package atomicfile writes files so that a reader sees either the old
// content or the whole new content, never a torn file, so that a key is
// never replaced unless the caller asked for it, and so that a process
// killed in the middle of a write leaves no named temporary copy behind
// (a stray temporary copy of a private key is a key nobody accounts for).
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/steward-trustd/steward-trustd/internal/crashpoint"
)

// ErrExists reports that the target exists and overwrite was not asked for.
var ErrExists = fs.ErrExist

// tempInfix is the part of a temporary file's name after ".<base>"; only
// names of the form ".<base>.tmp-<random>" are this package's.
const tempInfix = ".tmp-"

// Write writes data to path with mode perm, fsynced before it appears
// under path.
//
// Where the file system supports it (Linux, O_TMPFILE: ext4, xfs, btrfs,
// tmpfs) the data is written to an unnamed file that only gets a name by
// linkat(2): a crash before that leaves nothing, a crash after leaves the
// complete file. With overwrite false that link is the only step, and it
// fails if path exists, so two writers cannot both win and an existing
// file is never replaced. With overwrite true the file is linked under a
// temporary name ".<base>.tmp-<random>" and renamed over path.
//
// Elsewhere the data goes through such a named temporary file from the
// start; a crash can then leave it behind, and RemoveStale removes it.
func Write(path string, data []byte, perm os.FileMode, overwrite bool) error {
	if err := write(path, data, perm, overwrite); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("write %s: %w (refusing to overwrite)", path, ErrExists)
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

func write(path string, data []byte, perm os.FileMode, overwrite bool) error {
	f, err := openUnnamed(filepath.Dir(path), perm)
	if err != nil {
		return writeNamed(path, data, perm, overwrite)
	}
	defer func() { _ = f.Close() }() // fill synced it: closing cannot lose data
	if err := fill(f, data, perm); err != nil {
		return err
	}
	crashpoint.At("atomicfile.filled")
	if !overwrite {
		return linkUnnamed(f, path)
	}
	tmp, err := linkUnnamedTemp(f, path)
	if err != nil {
		return err
	}
	crashpoint.At("atomicfile.linked")
	if err := os.Rename(tmp, path); err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	return nil
}

// writeNamed is Write through a named temporary file.
func writeNamed(path string, data []byte, perm os.FileMode, overwrite bool) error {
	f, err := os.CreateTemp(filepath.Dir(path), tempPattern(path))
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() { _ = os.Remove(tmp) }() // no-op once renamed; removes the link source otherwise
	err = fill(f, data, perm)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	crashpoint.At("atomicfile.filled")
	if overwrite {
		return os.Rename(tmp, path)
	}
	return os.Link(tmp, path)
}

// fill sets the mode, writes data and fsyncs it.
func fill(f *os.File, data []byte, perm os.FileMode) error {
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	return f.Sync()
}

func tempPattern(path string) string {
	return "." + filepath.Base(path) + tempInfix + "*"
}

// RemoveStaleTemps removes the temporary files killed Writes left in dir
// (".<name>.tmp-<digits or hex>", this package's pattern and no other)
// and returns their paths. Call it only while no other process writes
// into dir: the ceremony holds its directory lock.
func RemoveStaleTemps(dir string) ([]string, error) {
	return removeTemps(dir, "")
}

// RemoveStaleTempsOf removes the temporary files killed Writes of path
// left beside it (".<base of path>.tmp-<suffix>") and returns their
// paths: for a file written in a directory that no lock's cleanup
// covers. Call it only while no other process writes path.
func RemoveStaleTempsOf(path string) ([]string, error) {
	return removeTemps(filepath.Dir(path), "."+filepath.Base(path)+tempInfix)
}

// removeTemps removes this package's temporary files in dir whose names
// start with prefix.
func removeTemps(dir, prefix string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var removed []string
	for _, e := range entries {
		if !e.Type().IsRegular() || !isTempName(e.Name()) || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("remove stale %s: %w", p, err)
		}
		removed = append(removed, p)
	}
	return removed, nil
}

// isTempName reports whether name is ".<base>.tmp-<suffix>" with a
// non-empty base and a suffix of hex digits (os.CreateTemp uses decimal
// digits, linkUnnamedTemp hex).
func isTempName(name string) bool {
	rest, ok := strings.CutPrefix(name, ".")
	if !ok {
		return false
	}
	i := strings.LastIndex(rest, tempInfix)
	if i <= 0 || i+len(tempInfix) == len(rest) {
		return false
	}
	for _, c := range rest[i+len(tempInfix):] {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer func() { _ = d.Close() }() // read only, for Sync
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
