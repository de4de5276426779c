//go:build linux

package atomicfile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// openUnnamed opens an unnamed regular file in dir (open(2) O_TMPFILE);
// it fails where the file system does not support that, and the caller
// falls back to a named temporary file.
func openUnnamed(dir string, perm os.FileMode) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		return nil, &fs.PathError{Op: "open O_TMPFILE", Path: dir, Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(dir, "(unnamed)")), nil
}

// linkUnnamed gives the unnamed file f the name path; it fails with
// fs.ErrExist if path exists (linkat(2) never replaces). Linking through
// /proc/self/fd with AT_SYMLINK_FOLLOW is the unprivileged way open(2)
// documents for O_TMPFILE files.
func linkUnnamed(f *os.File, path string) error {
	src := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	if err := unix.Linkat(unix.AT_FDCWD, src, unix.AT_FDCWD, path, unix.AT_SYMLINK_FOLLOW); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return &fs.PathError{Op: "link", Path: path, Err: fs.ErrExist}
		}
		return &fs.PathError{Op: "link", Path: path, Err: err}
	}
	return nil
}

// linkUnnamedTemp links f under a fresh temporary name next to path and
// returns that name.
func linkUnnamedTemp(f *os.File, path string) (string, error) {
	for range 8 {
		b := make([]byte, 8)
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+tempInfix+hex.EncodeToString(b))
		err := linkUnnamed(f, tmp)
		if !errors.Is(err, fs.ErrExist) {
			return tmp, err
		}
	}
	return "", fmt.Errorf("no free temporary name next to %s", path)
}
