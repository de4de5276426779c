package tpmpolicy

import (
	"crypto/ecdsa"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReadLimitedRefusesNonRegular: an approval file swapped for a FIFO
// between the directory scan's Stat and the read must be refused, not
// block the signer (which holds its mutex while it scans) forever.
func TestReadLimitedRefusesNonRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "swapped.json")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	regular := filepath.Join(dir, "ok.json")
	if err := os.WriteFile(regular, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, wantErr string
		limit               int64
		wantLen             int
	}{
		{"fifo", fifo, "not a regular file", 64, 0},
		{"regular", regular, "", 64, 10},
		{"oversized reads limit+1", regular, "", 4, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			type result struct {
				data []byte
				err  error
			}
			done := make(chan result, 1)
			go func() {
				data, err := readLimited(dir, tc.path, tc.limit)
				done <- result{data, err}
			}()
			select {
			case r := <-done:
				if tc.wantErr != "" {
					if r.err == nil || !strings.Contains(r.err.Error(), tc.wantErr) {
						t.Fatalf("readLimited = %v, want an error containing %q", r.err, tc.wantErr)
					}
					return
				}
				if r.err != nil || len(r.data) != tc.wantLen {
					t.Fatalf("readLimited = %d bytes, %v; want %d bytes", len(r.data), r.err, tc.wantLen)
				}
			case <-time.After(5 * time.Second):
				// Unblock the reader so that the test process can exit.
				if w, err := os.OpenFile(tc.path, os.O_WRONLY, 0); err == nil {
					w.Close()
				}
				t.Fatal("readLimited blocked on a non-regular file")
			}
		})
	}
}

// approvalDirFixture is an approvals directory of a v2 key (pcrs=7) under
// one authority, read by ApprovalDir with its log kept.
type approvalDirFixture struct {
	dir  string
	key  *ecdsa.PrivateKey
	auth *Authority
	data []byte // a valid approval file
	log  *strings.Builder
	d    *ApprovalDir
}

func newApprovalDirFixture(t *testing.T) *approvalDirFixture {
	k := p256(t)
	b := mustBinding(t, 7)
	a, err := SignApproval(k, b, []int{7}, [][]byte{pcrValue(1)}, ApprovalMeta{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := MarshalApprovals(a)
	if err != nil {
		t.Fatal(err)
	}
	f := &approvalDirFixture{dir: filepath.Join(t.TempDir(), "approvals"), key: k, auth: authority(t, k), data: data, log: &strings.Builder{}}
	if err := os.Mkdir(f.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f.d = NewApprovalDir(f.dir, []*Authority{f.auth}, b, time.Hour, slog.New(slog.NewTextHandler(f.log, nil)))
	return f
}

func (f *approvalDirFixture) write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// loaded lists the files whose approvals are in use.
func (f *approvalDirFixture) loaded() []string {
	var out []string
	for _, a := range f.d.Current(true) {
		out = append(out, a.File)
	}
	slices.Sort(out)
	return out
}

// TestApprovalDirSymlinks: a Kubernetes ConfigMap mount (NAME ->
// ..data/NAME, ..data -> ..TIMESTAMP) is read; a symlink leading out of
// the directory — to a valid approval file elsewhere, or through a
// directory link — is refused with one log line naming the target.
func TestApprovalDirSymlinks(t *testing.T) {
	f := newApprovalDirFixture(t)
	f.write(t, filepath.Join(f.dir, "..2026_12_03_10_00_00.1", "cm.json"), f.data)
	symlink(t, "..2026_12_03_10_00_00.1", filepath.Join(f.dir, "..data"))
	symlink(t, "..data/cm.json", filepath.Join(f.dir, "cm.json"))
	outside := filepath.Join(filepath.Dir(f.dir), "elsewhere")
	f.write(t, filepath.Join(outside, "x.json"), f.data)
	symlink(t, filepath.Join(outside, "x.json"), filepath.Join(f.dir, "outside.json"))
	symlink(t, outside, filepath.Join(f.dir, "sub"))
	symlink(t, "sub/x.json", filepath.Join(f.dir, "through-dir.json"))
	if got := f.loaded(); !slices.Equal(got, []string{"cm.json"}) {
		t.Fatalf("loaded %v, want only the ConfigMap's cm.json", got)
	}
	if n := strings.Count(f.log.String(), "outside the approvals directory"); n != 2 {
		t.Fatalf("%d log lines about links out of the directory, want 2:\n%s", n, f.log)
	}
	f.loaded()
	if n := strings.Count(f.log.String(), "outside the approvals directory"); n != 2 {
		t.Fatalf("a second scan logged the refused links again:\n%s", f.log)
	}
}

// TestApprovalDirCapCountsUsableFiles: invalid files do not count against
// the cap of MaxApprovalFiles usable files, so junk cannot push a valid
// approval out; past maxApprovalEntries entries the scan stops, with one
// warning.
func TestApprovalDirCapCountsUsableFiles(t *testing.T) {
	f := newApprovalDirFixture(t)
	for i := range MaxApprovalFiles + 44 {
		f.write(t, filepath.Join(f.dir, fmt.Sprintf("bad-%03d.json", i)), []byte("{"))
	}
	f.write(t, filepath.Join(f.dir, "zz-good.json"), f.data)
	if got := f.loaded(); !slices.Equal(got, []string{"zz-good.json"}) {
		t.Fatalf("loaded %v, want the valid approval despite %d invalid files", got, MaxApprovalFiles+44)
	}
	if strings.Contains(f.log.String(), "too many files") {
		t.Fatal("warned about the cap below it")
	}
	for i := range maxApprovalEntries {
		f.write(t, filepath.Join(f.dir, fmt.Sprintf("more-%04d.json", i)), []byte("{"))
	}
	f.loaded()
	f.loaded()
	if n := strings.Count(f.log.String(), "too many files"); n != 1 {
		t.Fatalf("%d warnings about the cap, want 1", n)
	}
}

// TestApprovalDirSymlinkSwapRace: a directory of the ConfigMap layout
// swapped for a symlink out of the approvals directory between the
// symlink check and the open must not make the signer read the file it
// leads to (the check is on what was opened, not on the path before).
func TestApprovalDirSymlinkSwapRace(t *testing.T) {
	f := newApprovalDirFixture(t)
	real := filepath.Join(f.dir, "..2026_12_03")
	f.write(t, filepath.Join(real, "cm.json"), f.data)
	symlink(t, "..2026_12_03/cm.json", filepath.Join(f.dir, "cm.json"))
	outside := filepath.Join(filepath.Dir(f.dir), "elsewhere")
	a, err := SignApproval(f.key, mustBinding(t, 7), []int{7}, [][]byte{pcrValue(2)}, ApprovalMeta{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := MarshalApprovals(a)
	if err != nil {
		t.Fatal(err)
	}
	f.write(t, filepath.Join(outside, "cm.json"), data)
	stop := make(chan struct{})
	flipped := make(chan struct{})
	go func() {
		defer close(flipped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = os.Rename(real, real+".moved")
			_ = os.Symlink(outside, real)
			_ = os.Remove(real)
			_ = os.Rename(real+".moved", real)
		}
	}()
	defer func() { close(stop); <-flipped }()
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		f.d.files = map[string]approvalFileState{} // re-read every time
		for _, c := range f.d.Current(true) {
			if hex.EncodeToString(c.Pol) == a.Pol {
				t.Fatalf("read the approval outside the directory through a swapped symlink")
			}
		}
	}
}
