//go:build linux

package issuelog

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestFullDiskIsUnavailable: a write the file system refuses for space
// (here the file-size limit, RLIMIT_FSIZE, which Go turns into EFBIG as a
// full disk gives ENOSPC) answers ErrUnavailable, leaves no partial record,
// and the log appends again once there is room, reporting the recovery.
func TestFullDiskIsUnavailable(t *testing.T) {
	dir := t.TempDir()
	var states []error
	l, err := Open(dir, Options{Signer: newSigner(t, ecKey(t)), OnHealth: func(err error) { states = append(states, err) }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Append(context.Background(), []byte(`{"v":1,"event":"denied"}`)); err != nil {
		t.Fatal(err)
	}
	entries := filepath.Join(dir, FileEntries)
	before, _ := os.ReadFile(entries)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	full := lim
	full.Cur = uint64(len(before)) + 100
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &full); err != nil {
		t.Fatal(err)
	}
	_, err = l.Append(context.Background(), bytes.Repeat([]byte("x"), 1000))
	if rerr := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); rerr != nil {
		t.Fatal(rerr)
	}
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, syscall.EFBIG) || l.Healthy() == nil {
		t.Fatalf("append on a full file system: %v (healthy %v)", err, l.Healthy())
	}
	if after, _ := os.ReadFile(entries); !bytes.Equal(after, before) {
		t.Fatalf("a refused write left %d bytes behind", len(after)-len(before))
	}
	if _, err := l.Append(context.Background(), []byte(`{"v":1,"event":"denied"}`)); err != nil || l.Healthy() != nil || len(states) != 2 {
		t.Fatalf("after space returned: %v, states %v", err, states)
	}
}
