package tpmpolicy

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// DefaultApprovalsReload is how often the approvals directory is checked
// for changes (at most; only when the key is used).
const DefaultApprovalsReload = time.Second

// MaxApprovalFiles bounds the approval files used from an approvals
// directory; only files that hold usable approvals count.
const MaxApprovalFiles = 256

// maxApprovalEntries bounds the directory entries one scan looks at
// (valid or not), so that a directory filled with junk costs a bounded
// scan; the listing is read in batches of approvalDirBatch, never whole.
const (
	maxApprovalEntries = 16 * MaxApprovalFiles
	approvalDirBatch   = 64
)

// ApprovalDir keeps the approvals of an approvals directory, re-reading
// it at most once per interval, by name, size and modification time (as
// the daemon watches its cert dir), so that a ConfigMap update or a copied
// file is picked up without a restart. A malformed or tampered file, or a
// symlink leading out of the directory, is ignored with one log line (per
// change of that file); the others are still used. Not safe for
// concurrent use: the caller serializes (the tpm Signer holds its lock).
type ApprovalDir struct {
	dir      string
	auths    []*Authority
	binding  Binding
	interval time.Duration
	log      *slog.Logger
	now      func() time.Time

	lastScan time.Time
	dirErr   string // the last error reading the directory, for one log line per change
	capped   bool   // the last scan stopped at a cap, for one log line per change
	files    map[string]approvalFileState
	sorted   []CheckedApproval // newest first
}

type approvalFileState struct {
	target    string // the file read: the name with symlinks resolved
	size      int64
	mtime     time.Time
	approvals []CheckedApproval // nil when the file was refused
}

// NewApprovalDir watches the approvals directory dir of a key under the
// authorities auths with binding b; interval <= 0 is
// DefaultApprovalsReload. Nothing is read before the first Current.
func NewApprovalDir(dir string, auths []*Authority, b Binding, interval time.Duration, log *slog.Logger) *ApprovalDir {
	if interval <= 0 {
		interval = DefaultApprovalsReload
	}
	return &ApprovalDir{dir: dir, auths: auths, binding: b, interval: interval, log: log, now: time.Now, files: map[string]approvalFileState{}}
}

// Current returns the approvals, newest first, after re-reading the
// directory if the interval has passed (or force is set).
func (d *ApprovalDir) Current(force bool) []CheckedApproval {
	if !force && !d.lastScan.IsZero() && d.now().Sub(d.lastScan) < d.interval {
		return d.sorted
	}
	d.lastScan = d.now()
	d.scan()
	return d.sorted
}

func (d *ApprovalDir) scan() {
	next, capped, err := d.list()
	if err != nil {
		if err.Error() != d.dirErr {
			d.log.Error("tpm: cannot read the approvals directory; no PCR state is approved until it is readable", "dir", d.dir, "error", err)
		}
		d.dirErr = err.Error()
		d.files, d.sorted = map[string]approvalFileState{}, nil
		return
	}
	if d.dirErr != "" {
		d.log.Info("tpm: the approvals directory is readable again", "dir", d.dir)
		d.dirErr = ""
	}
	if capped != d.capped && capped {
		d.log.Warn("tpm: approvals directory holds too many files; the rest are ignored: remove retired approvals",
			"dir", d.dir, "MaxApprovalFiles", MaxApprovalFiles, "maxEntries", maxApprovalEntries)
	}
	d.capped = capped
	d.files = next
	d.sorted = d.sorted[:0]
	for _, st := range next {
		d.sorted = append(d.sorted, st.approvals...)
	}
	slices.SortStableFunc(d.sorted, func(a, b CheckedApproval) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), strings.Compare(a.File, b.File))
	})
}

// list reads the directory in batches and the approval files in it, up
// to MaxApprovalFiles usable files and maxApprovalEntries entries; capped
// says whether it stopped at a cap.
func (d *ApprovalDir) list() (next map[string]approvalFileState, capped bool, err error) {
	root, err := filepath.EvalSymlinks(d.dir)
	if err != nil {
		return nil, false, err
	}
	f, err := os.Open(root)
	if err != nil {
		return nil, false, err
	}
	defer func() { _ = f.Close() }() // read only
	next = map[string]approvalFileState{}
	usable, seen := 0, 0
	for {
		entries, err := f.ReadDir(approvalDirBatch)
		for _, e := range entries {
			if usable >= MaxApprovalFiles || seen >= maxApprovalEntries {
				return next, true, nil
			}
			seen++
			if name := e.Name(); strings.HasSuffix(name, ".json") && !strings.HasPrefix(name, ".") {
				if st, ok := d.readFile(root, name); ok {
					next[name] = st
					usable += min(len(st.approvals), 1)
				}
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(entries) == 0) {
			return next, false, nil
		}
		if err != nil {
			return nil, false, err
		}
	}
}

// readFile returns the state of one file, re-parsed only if it changed.
// It follows symlinks (a Kubernetes ConfigMap mount is made of them:
// NAME -> ..data/NAME -> ..TIMESTAMP/NAME) as long as they stay inside the
// directory: a symlink leading out of it is refused, so that a link
// planted in the ConfigMap cannot make the signer read another file.
func (d *ApprovalDir) readFile(root, name string) (approvalFileState, bool) {
	path := filepath.Join(d.dir, name)
	target, err := inside(root, path)
	if errors.Is(err, fs.ErrNotExist) {
		return approvalFileState{}, false // removed since the listing, or a ConfigMap swap under way
	}
	if err != nil {
		st := approvalFileState{target: "!" + err.Error()}
		if old, ok := d.files[name]; !ok || old.target != st.target {
			d.log.Error("tpm: approval file ignored; the other approvals are still used", "file", path, "error", err)
		}
		return st, true
	}
	fi, err := os.Stat(target)
	if err != nil || !fi.Mode().IsRegular() {
		return approvalFileState{}, false
	}
	if old, ok := d.files[name]; ok && old.target == target && old.size == fi.Size() && old.mtime.Equal(fi.ModTime()) {
		return old, true
	}
	st := approvalFileState{target: target, size: fi.Size(), mtime: fi.ModTime()}
	data, err := readLimited(root, target, MaxApprovalFileSize)
	if err == nil {
		st.approvals, err = ParseApprovals(name, data, d.auths, d.binding)
	}
	if err != nil {
		d.log.Error("tpm: approval file ignored; the other approvals are still used", "file", path, "error", err)
		return st, true
	}
	d.log.Info("tpm: approval file loaded", "file", path, "approvals", len(st.approvals))
	return st, true
}

// inside resolves the symlinks of path and checks that the file it names
// is inside root, the approvals directory with its own symlinks resolved.
func inside(root, path string) (string, error) {
	target, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	if !within(root, target) {
		return "", fmt.Errorf("%s is a symlink to %s, outside the approvals directory %s; put the approval file itself in the directory", path, target, root)
	}
	return target, nil
}

// within reports whether the resolved path p is root or under it
// (lexically: p has no symlinks left to follow).
func within(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// readLimited reads at most limit+1 bytes of path, so that an oversized
// file is refused without reading all of it. It opens without blocking
// and checks the opened file is regular: a file swapped for a FIFO after
// the scan's Stat would otherwise block the open, and the signer holding
// its mutex, until something writes to it. It also checks that the file
// opened is inside root: a directory on the way swapped for a symlink
// after inside's check would otherwise lead the open out of it.
func readLimited(root, path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only
	if err := openedInside(root, f); err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s); put approval files in the directory as plain files", path, fi.Mode().Type())
	}
	return io.ReadAll(io.LimitReader(f, limit+1))
}

// openedInside checks that the file f is inside root by the path the
// kernel opened (/proc/self/fd, proc(5)), which no later rename changes
// into another file.
func openedInside(root string, f *os.File) error {
	opened, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return fmt.Errorf("cannot tell which file %s opened (is /proc mounted?): %w", f.Name(), err)
	}
	if !within(root, opened) {
		return fmt.Errorf("%s led out of the approvals directory %s to %s while it was opened (a symlink swapped in); put the approval file itself in the directory", f.Name(), root, opened)
	}
	return nil
}
