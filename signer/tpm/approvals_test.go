package tpm

import (
	"os"
	"path/filepath"
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
				data, err := readLimited(tc.path, tc.limit)
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
