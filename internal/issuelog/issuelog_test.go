package issuelog

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func newSigner(t testing.TB, key crypto.Signer) *NoteSigner {
	t.Helper()
	s, err := NewNoteSigner("steward-trustd.test/node-a", key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ecKey(t testing.TB) crypto.Signer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// fill opens a log in dir, appends n entries, closes it (signing the
// last checkpoint) and returns the verifier key.
func fill(t *testing.T, dir string, s *NoteSigner, n int) {
	t.Helper()
	l, err := Open(dir, Options{Signer: s, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := l.Append(context.Background(), []byte(fmt.Sprintf(`{"v":1,"event":"denied","reason":"r%d"}`, i))); err != nil {
			t.Fatal(err)
		}
		if i%3 == 2 { // several checkpoints, to check consistency between them
			if err := l.SignCheckpoint(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestAppendVerify appends with an Ed25519 and an ECDSA log key, reopens,
// and verifies: every checkpoint signed, consistent, covering all entries.
func TestAppendVerify(t *testing.T) {
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	for _, key := range []crypto.Signer{ed, ecKey(t)} {
		dir := t.TempDir()
		s := newSigner(t, key)
		fill(t, dir, s, 10)
		fill(t, dir, s, 5) // reopened: the tree continues
		snap, err := ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		r, err := Verify(snap, s.Verifier())
		if err != nil || !r.OK() || r.Entries != 15 || r.Latest.Size != 15 || r.Checkpoints < 5 {
			t.Fatalf("%T: %v %+v", key, err, r)
		}
		in, err := Prove(snap, 7, r.Latest)
		if err != nil || in.Check() != nil {
			t.Errorf("%T: inclusion proof: %v", key, err)
		}
	}
}

// TestVerifyDetects: each way of rewriting a log is named by Verify.
func TestVerifyDetects(t *testing.T) {
	s := newSigner(t, ecKey(t))
	other := newSigner(t, ecKey(t))
	tests := []struct {
		name   string
		damage func(t *testing.T, dir string)
		want   string
	}{
		{"tampered entry", func(t *testing.T, dir string) {
			rewriteEntries(t, dir, func(e [][]byte) [][]byte { e[4] = []byte(`{"v":1,"event":"denied","reason":"X"}`); return e })
		}, "tampered entry: entries 3..5"},
		{"edited in place", func(t *testing.T, dir string) { flipByte(t, filepath.Join(dir, FileEntries), 30) }, "tampered entry: entries.log is damaged"},
		{"removed entry", func(t *testing.T, dir string) {
			rewriteEntries(t, dir, func(e [][]byte) [][]byte { return append(e[:2], e[3:]...) })
		}, "removed entry"},
		{"forked log", func(t *testing.T, dir string) { forkLog(t, dir, s) }, "forked log: two checkpoints of size 9"},
		{"another key", func(t *testing.T, dir string) { signWith(t, dir, other) }, "checkpoint signed by another key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			fill(t, dir, s, 9)
			tt.damage(t, dir)
			snap, err := ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			r, err := Verify(snap, s.Verifier())
			if err != nil || r.OK() || !strings.Contains(strings.Join(r.Problems, "\n"), tt.want) {
				t.Fatalf("err %v, problems %q, want one naming %q", err, r.Problems, tt.want)
			}
		})
	}
}

// rewriteEntries rewrites entries.log with valid framing: an attacker who
// knows the format.
func rewriteEntries(t *testing.T, dir string, edit func([][]byte) [][]byte) {
	t.Helper()
	snap, err := ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var buf []byte
	for _, e := range edit(snap.Entries) {
		buf = appendRecord(buf, e)
	}
	if err := os.WriteFile(filepath.Join(dir, FileEntries), buf, 0o644); err != nil {
		t.Fatal(err)
	}
}

func flipByte(t *testing.T, path string, at int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[at] ^= 0x20
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// forkLog keeps the owner's copy of the checkpoint of size 9, rewrites an
// entry, and has the log key sign the new history of the same size.
func forkLog(t *testing.T, dir string, s *NoteSigner) {
	t.Helper()
	saved, err := os.ReadFile(filepath.Join(dir, FileCheckpoint))
	if err != nil {
		t.Fatal(err)
	}
	rewriteEntries(t, dir, func(e [][]byte) [][]byte { e[1] = []byte(`{"v":1,"event":"denied","reason":"forked"}`); return e })
	os.RemoveAll(filepath.Join(dir, DirCheckpoints))
	os.Remove(filepath.Join(dir, FileCheckpoint))
	fill(t, dir, s, 0)
	if err := os.WriteFile(filepath.Join(dir, "owner-saved.checkpoint"), saved, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, DirCheckpoints, "owner-saved"), saved, 0o644); err != nil {
		t.Fatal(err)
	}
}

// signWith replaces the latest checkpoint by one of another key.
func signWith(t *testing.T, dir string, other *NoteSigner) {
	t.Helper()
	os.RemoveAll(filepath.Join(dir, DirCheckpoints))
	os.Remove(filepath.Join(dir, FileCheckpoint))
	fill(t, dir, other, 0)
}

// TestOpenCutsATornRecord: a crash in the middle of a write leaves a
// partial record, never acknowledged; opening cuts it and appends on.
func TestOpenCutsATornRecord(t *testing.T) {
	dir := t.TempDir()
	s := newSigner(t, ecKey(t))
	fill(t, dir, s, 3)
	f, _ := os.OpenFile(filepath.Join(dir, FileEntries), os.O_WRONLY|os.O_APPEND, 0)
	f.Write(appendRecord(nil, []byte(`{"v":1,"event":"denied"}`))[:12])
	f.Close()
	fill(t, dir, s, 2)
	snap, _ := ReadDir(dir)
	if r, err := Verify(snap, s.Verifier()); err != nil || !r.OK() || r.Entries != 5 {
		t.Fatalf("%v %+v", err, r)
	}
}

// TestOpenRefusesAnAlteredLog: the daemon does not start on a log whose
// entries no longer give its latest checkpoint.
func TestOpenRefusesAnAlteredLog(t *testing.T) {
	dir := t.TempDir()
	s := newSigner(t, ecKey(t))
	fill(t, dir, s, 4)
	rewriteEntries(t, dir, func(e [][]byte) [][]byte { return e[:2] })
	if _, err := Open(dir, Options{Signer: s}); err == nil || !strings.Contains(err.Error(), "entries were removed") {
		t.Fatalf("err = %v", err)
	}
}

// TestAppendFailureIsUnavailable: a write that fails (here: the file
// closed under the log, as a failing disk would) answers ErrUnavailable
// and reports the state once; nothing half-written stays.
func TestAppendFailureIsUnavailable(t *testing.T) {
	dir := t.TempDir()
	var states []error
	l, err := Open(dir, Options{Signer: newSigner(t, ecKey(t)), OnHealth: func(err error) { states = append(states, err) }})
	if err != nil {
		t.Fatal(err)
	}
	l.f.Close()
	for range 2 {
		if _, err := l.Append(context.Background(), []byte("x")); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("err = %v", err)
		}
	}
	if l.Healthy() == nil || len(states) != 1 {
		t.Errorf("healthy %v, states %v", l.Healthy(), states)
	}
}

// TestOpenRefusesAnUnwritableDir: the daemon refuses to start with one
// line naming the directory.
func TestOpenRefusesAnUnwritableDir(t *testing.T) {
	if os.Geteuid() == 0 {
		// root writes anywhere: a regular file in the way of the directory does it.
		dir := filepath.Join(t.TempDir(), "log")
		os.WriteFile(dir, nil, 0o644)
		_, err := Open(dir, Options{Signer: newSigner(t, ecKey(t))})
		if err == nil || !strings.Contains(err.Error(), "not writable") || strings.Contains(err.Error(), "\n") {
			t.Fatalf("err = %v", err)
		}
		return
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o500)
	if _, err := Open(dir, Options{Signer: newSigner(t, ecKey(t))}); err == nil || !strings.Contains(err.Error(), "not writable") {
		t.Fatalf("err = %v", err)
	}
}

// TestServedLogVerifies fetches a log over its HTTP handler (C2SP
// tlog-tiles paths, more than one entry bundle) and verifies it; the
// hash tiles served are the tree's.
func TestServedLogVerifies(t *testing.T) {
	dir := t.TempDir()
	s := newSigner(t, ecKey(t))
	l, err := Open(dir, Options{Signer: s, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range 300 {
		if _, err := l.Append(context.Background(), []byte(fmt.Sprintf(`{"v":1,"event":"denied","reason":"%d"}`, i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.SignCheckpoint(); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(l.Handler("/log/"))
	defer srv.Close()
	snap, err := Fetch(context.Background(), srv.Client(), srv.URL+"/log")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := Verify(snap, s.Verifier()); err != nil || !r.OK() || r.Entries != 300 {
		t.Fatalf("%v %+v", err, r.Problems)
	}
	resp, err := srv.Client().Get(srv.URL + "/log/tile/0/000")
	if err != nil || resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Cache-Control"), "immutable") {
		t.Fatalf("hash tile: %v %v", err, resp)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if len(body) != 256*32 {
		t.Errorf("full hash tile of %d bytes", len(body))
	}
	for _, bad := range []string{"/log/tile/0/999", "/log/../etc/passwd", "/log/tile/entries/x1", "/log/" + strings.Repeat("a", 200)} {
		if resp, err := srv.Client().Get(srv.URL + bad); err != nil || resp.StatusCode < 400 {
			t.Errorf("%s: %v %v", bad, err, resp)
		}
	}
	if resp, err := srv.Client().Post(srv.URL+"/log/checkpoint", "text/plain", nil); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %v %v", err, resp)
	}
}

// TestWitnessCatchesARewrite: another replica's operator cosigns the
// log's checkpoints (C2SP cosignature/v1); after the log is rewritten and
// re-signed at the same size, the witness refuses to cosign, naming the fork.
func TestWitnessCatchesARewrite(t *testing.T) {
	dir, state := t.TempDir(), t.TempDir()
	s := newSigner(t, ecKey(t))
	fill(t, dir, s, 6)
	_, wkey, _ := ed25519.GenerateKey(rand.Reader)
	w, err := NewCosigner("steward-trustd.test/witness-b", wkey, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	snap, _ := ReadDir(dir)
	cosigned, _, err := Witness(snap, s.Verifier(), w, state)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := CheckCosignature(cosigned, w.Verifier()); err != nil {
		t.Fatalf("cosignature: %v\n%s", err, cosigned)
	}
	if _, err := ParseCheckpoint(cosigned, s.Verifier()); err != nil {
		t.Fatalf("the cosigned checkpoint no longer verifies under the log key: %v", err)
	}
	fill(t, dir, s, 2) // the log grows honestly: cosigned again
	snap, _ = ReadDir(dir)
	if _, _, err := Witness(snap, s.Verifier(), w, state); err != nil {
		t.Fatalf("an honest append refused: %v", err)
	}
	rewriteEntries(t, dir, func(e [][]byte) [][]byte { e[2] = []byte(`{"v":1,"event":"denied","reason":"rewritten"}`); return e })
	os.RemoveAll(filepath.Join(dir, DirCheckpoints))
	os.Remove(filepath.Join(dir, FileCheckpoint))
	fill(t, dir, s, 0) // the host's log key signs the new history
	snap, _ = ReadDir(dir)
	if _, r, err := Witness(snap, s.Verifier(), w, state); err == nil || !strings.Contains(err.Error(), "forked log") {
		t.Fatalf("a rewritten log was cosigned: %v %+v", err, r)
	}
}
