package tpm

import (
	"cmp"
	"fmt"
	"io"
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

// maxApprovalFiles bounds the files read from an approvals directory.
const maxApprovalFiles = 256

// approvalDir keeps the approvals of an approvals directory, re-reading
// it at most once per interval, by name, size and modification time (as
// the daemon watches its cert dir), so that a ConfigMap update or a copied
// file is picked up without a restart. A malformed or tampered file is
// ignored with one log line (per change of that file); the others are
// still used. Not safe for concurrent use: the Signer's mutex guards it.
type approvalDir struct {
	dir      string
	auths    []*Authority
	interval time.Duration
	log      *slog.Logger
	now      func() time.Time

	lastScan time.Time
	dirErr   string // the last error reading the directory, for one log line per change
	files    map[string]approvalFileState
	sorted   []checkedApproval // newest first
}

type approvalFileState struct {
	size      int64
	mtime     time.Time
	approvals []checkedApproval // nil when the file was refused
}

func newApprovalDir(dir string, auths []*Authority, interval time.Duration, log *slog.Logger) *approvalDir {
	if interval <= 0 {
		interval = DefaultApprovalsReload
	}
	return &approvalDir{dir: dir, auths: auths, interval: interval, log: log, now: time.Now, files: map[string]approvalFileState{}}
}

// current returns the approvals, newest first, after re-reading the
// directory if the interval has passed (or force is set).
func (d *approvalDir) current(force bool) []checkedApproval {
	if !force && !d.lastScan.IsZero() && d.now().Sub(d.lastScan) < d.interval {
		return d.sorted
	}
	d.lastScan = d.now()
	d.scan()
	return d.sorted
}

func (d *approvalDir) scan() {
	entries, err := os.ReadDir(d.dir)
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
	next := make(map[string]approvalFileState, len(entries))
	for _, e := range entries {
		if len(next) >= maxApprovalFiles {
			d.log.Warn("tpm: approvals directory holds too many files; the rest are ignored", "dir", d.dir, "max", maxApprovalFiles)
			break
		}
		if name := e.Name(); strings.HasSuffix(name, ".json") && !strings.HasPrefix(name, ".") {
			if st, ok := d.readFile(name); ok {
				next[name] = st
			}
		}
	}
	d.files = next
	d.sorted = d.sorted[:0]
	for _, st := range next {
		d.sorted = append(d.sorted, st.approvals...)
	}
	slices.SortStableFunc(d.sorted, func(a, b checkedApproval) int {
		return cmp.Or(b.createdAt.Compare(a.createdAt), strings.Compare(a.file, b.file))
	})
}

// readFile returns the state of one file, re-parsed only if it changed.
// It follows symlinks (a Kubernetes ConfigMap mount is made of them).
func (d *approvalDir) readFile(name string) (approvalFileState, bool) {
	path := filepath.Join(d.dir, name)
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return approvalFileState{}, false
	}
	if old, ok := d.files[name]; ok && old.size == fi.Size() && old.mtime.Equal(fi.ModTime()) {
		return old, true
	}
	st := approvalFileState{size: fi.Size(), mtime: fi.ModTime()}
	data, err := readLimited(path, MaxApprovalFileSize)
	if err == nil {
		st.approvals, err = parseApprovals(name, data, d.auths)
	}
	if err != nil {
		d.log.Error("tpm: approval file ignored; the other approvals are still used", "file", path, "error", err)
		return st, true
	}
	d.log.Info("tpm: approval file loaded", "file", path, "approvals", len(st.approvals))
	return st, true
}

// readLimited reads at most limit+1 bytes of path, so that an oversized
// file is refused without reading all of it. It opens without blocking
// and checks the opened file is regular: a file swapped for a FIFO after
// the scan's Stat would otherwise block the open, and the signer holding
// its mutex, until something writes to it.
func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s); put approval files in the directory as plain files", path, fi.Mode().Type())
	}
	return io.ReadAll(io.LimitReader(f, limit+1))
}
