// Package atomicfile writes files so that a reader sees either the old
// content or the whole new content, never a torn file, and so that a key is
// never replaced unless the caller asked for it.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ErrExists reports that the target exists and overwrite was not asked for.
var ErrExists = fs.ErrExist

// Write writes data to path with mode perm through a temporary file in the
// same directory, fsynced before it is moved into place. With overwrite
// false the move is a hard link, which fails if path exists, so two writers
// cannot both win and an existing file is never replaced.
func Write(path string, data []byte, perm os.FileMode, overwrite bool) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmpName := tmp.Name()
	defer os.Remove(tmpName) // no-op once renamed; removes the link source otherwise
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if overwrite {
		err = os.Rename(tmpName, path)
	} else {
		err = os.Link(tmpName, path)
	}
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("write %s: %w (refusing to overwrite)", path, ErrExists)
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
