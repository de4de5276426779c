package keystore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/steward-trustd/steward-trustd/internal/atomicfile"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/crashpoint"
)

// Dir is the output directory of a ceremony. Names are slash-separated
// paths relative to the directory (fs.ValidPath). It is an interface so
// that tests can make any write fail and check that nothing is left
// half-written.
type Dir interface {
	// ReadFile returns the content of name; a missing file is an error
	// wrapping fs.ErrNotExist.
	ReadFile(name string) ([]byte, error)
	// Exists reports whether name exists.
	Exists(name string) (bool, error)
	// WriteFile writes name atomically with mode perm. Without overwrite
	// an existing file is never replaced and the error wraps fs.ErrExist.
	WriteFile(name string, data []byte, perm fs.FileMode, overwrite bool) error
	// Remove deletes name; a missing file is not an error.
	Remove(name string) error
	// List returns the names of the regular files directly under the
	// directory name, sorted; a missing directory lists nothing.
	List(name string) ([]string, error)
	// Path returns the absolute operating-system path of name, for
	// messages and receipts.
	Path(name string) string
}

// OSDir is a Dir on the local file system. Every write goes through
// internal/atomicfile; parent directories are created with mode 0700.
type OSDir struct {
	// Root is the directory path.
	Root string
}

func (d OSDir) resolve(name string) (string, error) {
	if !fs.ValidPath(name) {
		return "", fmt.Errorf("invalid file name %q", name)
	}
	return filepath.Join(d.Root, filepath.FromSlash(name)), nil
}

// Path implements Dir: the absolute path of name, the one style receipts
// record files in (an issued certificate may be written anywhere).
func (d OSDir) Path(name string) string {
	p := filepath.Join(d.Root, filepath.FromSlash(name))
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

// ReadFile implements Dir.
func (d OSDir) ReadFile(name string) ([]byte, error) {
	p, err := d.resolve(name)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(p)
}

// Exists implements Dir.
func (d OSDir) Exists(name string) (bool, error) {
	p, err := d.resolve(name)
	if err != nil {
		return false, err
	}
	_, err = os.Lstat(p)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, err
	}
}

// WriteFile implements Dir.
func (d OSDir) WriteFile(name string, data []byte, perm fs.FileMode, overwrite bool) error {
	p, err := d.resolve(name)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("create directory for %s: %w", p, err)
	}
	return atomicfile.Write(p, data, perm, overwrite)
}

// Remove implements Dir.
func (d OSDir) Remove(name string) error {
	p, err := d.resolve(name)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// List implements Dir.
func (d OSDir) List(name string) ([]string, error) {
	p, err := d.resolve(name)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// File is one file of a set written together.
type File struct {
	// Name is relative to the Dir.
	Name string
	// Data is the content.
	Data []byte
	// Mode is the permission; secrets are 0600.
	Mode fs.FileMode
	// Remove asks for the file to be deleted instead of written (used by
	// rotate --finish to drop accepted-cas.crt).
	Remove bool
}

// ErrExists reports that a ceremony would overwrite files and --force was
// not given. It wraps fs.ErrExist.
var ErrExists = fmt.Errorf("refusing to overwrite existing files without --force: %w", fs.ErrExist)

// checkAbsent returns an error wrapping ErrExists that lists every file of
// files already present in d.
func checkAbsent(d Dir, files []File) error {
	return checkPlacedAbsent(place(d, files, false))
}

// checkPlacedAbsent returns an error wrapping ErrExists that lists every
// file of files that is already present and may not be overwritten.
func checkPlacedAbsent(files []placement) error {
	var present []string
	for _, p := range files {
		if p.Overwrite || p.File.Remove {
			continue
		}
		ok, err := p.Dir.Exists(p.File.Name)
		if err != nil {
			return fmt.Errorf("check %s: %w", p.Dir.Path(p.File.Name), err)
		}
		if ok {
			present = append(present, p.Dir.Path(p.File.Name))
		}
	}
	if len(present) > 0 {
		return fmt.Errorf("%w: %s", ErrExists, strings.Join(present, ", "))
	}
	return nil
}

// WriteSet writes files into d as one unit: without overwrite it first
// checks that none exists and writes nothing otherwise; each file is
// written atomically; if any write fails, the files already written are
// removed again (or, when they replaced a file, restored from the content
// read before the first write), so a failure leaves the directory as it
// was. A crash of the whole process between two writes cannot be undone
// this way; ceremonies detect such a partial set on the next run.
func WriteSet(d Dir, files []File, overwrite bool) error {
	return writePlaced(place(d, files, overwrite))
}

// place puts every file of files in d with the same overwrite permission.
func place(d Dir, files []File, overwrite bool) []placement {
	placed := make([]placement, len(files))
	for i, f := range files {
		placed[i] = placement{Dir: d, File: f, Overwrite: overwrite}
	}
	return placed
}

// placement is a File in a given Dir, with its own overwrite permission.
type placement struct {
	Dir       Dir
	File      File
	Overwrite bool
}

// writePlaced is WriteSet for files spread over several directories (an
// output file and the receipt that records it).
func writePlaced(files []placement) error {
	if err := checkPlacedAbsent(files); err != nil {
		return err
	}
	backups, err := readBackups(files)
	if err != nil {
		return err
	}
	for i, p := range files {
		if err := p.apply(); err != nil {
			if rbErr := rollback(files[:i], backups[:i]); rbErr != nil {
				return fmt.Errorf("write %s: %w (and the roll back failed: %w)", p.path(), err, rbErr)
			}
			return fmt.Errorf("write %s: %w (no file was changed)", p.path(), err)
		}
		crashpoint.At("wrote " + stepName(p.File.Name))
	}
	return nil
}

// path returns the operating-system path of p, for messages.
func (p placement) path() string { return p.Dir.Path(p.File.Name) }

// apply writes p, or removes it when it asks to be removed.
func (p placement) apply() error {
	if p.File.Remove {
		return p.Dir.Remove(p.File.Name)
	}
	return p.Dir.WriteFile(p.File.Name, p.File.Data, p.File.Mode, p.Overwrite)
}

// backup is what a file held before writePlaced changed it, so that a
// failed set can be rolled back.
type backup struct {
	data []byte
	had  bool
	mode fs.FileMode
}

// readBackups reads the current content of every file of files; a missing
// file is recorded as absent.
func readBackups(files []placement) ([]backup, error) {
	backups := make([]backup, 0, len(files))
	for _, p := range files {
		b := backup{mode: p.File.Mode}
		data, err := p.Dir.ReadFile(p.File.Name)
		switch {
		case err == nil:
			b.data, b.had = data, true
			if b.mode == 0 {
				b.mode = 0o600
			}
		case errors.Is(err, fs.ErrNotExist):
		default:
			return nil, fmt.Errorf("read %s before replacing it: %w", p.path(), err)
		}
		backups = append(backups, b)
	}
	return backups, nil
}

// rollback undoes the writes of files, newest first: a file that existed
// gets its backup back, a new one is removed.
func rollback(files []placement, backups []backup) error {
	var errs []error
	for i := len(files) - 1; i >= 0; i-- {
		p, b := files[i], backups[i]
		var err error
		if b.had {
			err = p.Dir.WriteFile(p.File.Name, b.data, b.mode, true)
		} else {
			err = p.Dir.Remove(p.File.Name)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("roll back %s: %w", p.path(), err))
		}
	}
	return errors.Join(errs...)
}

// stepName names the crash point after writing name; receipts share
// one name, since theirs differ in every run.
func stepName(name string) string {
	if strings.HasPrefix(name, certdir.DirReceipts+"/") {
		return "a receipt"
	}
	return name
}

// readOptional reads name from d; a missing file is (nil, nil).
func readOptional(d Dir, name string) ([]byte, error) {
	b, err := d.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", d.Path(name), err)
	}
	return b, nil
}
