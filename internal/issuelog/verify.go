package issuelog

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/steward-trustd/steward-trustd/internal/certlint"
)

// Snapshot is a copy of a log to verify: its entries and every signed
// checkpoint collected for it (the log's own history, and any an owner or
// a witness saved).
type Snapshot struct {
	Entries [][]byte
	// Damaged, when not empty, says where entries.log stopped parsing.
	Damaged string
	// Checkpoints are raw signed notes, by where they came from.
	Checkpoints map[string][]byte
}

// ReadDir reads a log directory (entries.log, checkpoint, checkpoints/*).
func ReadDir(dir string) (*Snapshot, error) {
	data, err := os.ReadFile(filepath.Join(dir, FileEntries))
	if err != nil {
		return nil, fmt.Errorf("read log: %w", err)
	}
	s := &Snapshot{Checkpoints: map[string][]byte{}}
	var good int64
	s.Entries, good, err = readRecords(data)
	if err != nil {
		s.Damaged = fmt.Sprintf("%v (byte %d of %d)", err, good, len(data))
	}
	paths, _ := filepath.Glob(filepath.Join(dir, DirCheckpoints, "*"))
	paths = append(paths, filepath.Join(dir, FileCheckpoint))
	for _, p := range paths {
		if strings.HasPrefix(filepath.Base(p), ".") {
			continue // an atomic write's temporary
		}
		if b, err := os.ReadFile(p); err == nil {
			s.Checkpoints[p] = b
		}
	}
	return s, nil
}

// Report is what Verify found. Problems name each violation; a log with
// none verified.
type Report struct {
	Entries     int64
	Checkpoints int
	Latest      Checkpoint
	Issued      int
	Problems    []string
}

// OK reports a log without problems.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

func (r *Report) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// Verify recomputes the tree of s, checks every checkpoint's signature
// with the pinned verifier key, its root against the entries, and the
// consistency between successive checkpoints (RFC 6962 §2.1.2 proofs),
// and lints every issued certificate again.
func Verify(s *Snapshot, vkey string) (*Report, error) {
	if _, err := NewVerifier(vkey); err != nil {
		return nil, err
	}
	r := &Report{Entries: int64(len(s.Entries))}
	if s.Damaged != "" {
		r.problem("tampered entry: entries.log is damaged after entry %d: %s", len(s.Entries), s.Damaged)
	}
	hashes, err := treeHashes(s.Entries)
	if err != nil {
		return nil, err
	}
	cps := checkpoints(r, s, vkey)
	checkRoots(r, cps, hashes)
	checkEntries(r, s.Entries)
	return r, nil
}

func treeHashes(entries [][]byte) (tlog.HashReader, error) {
	var hashes []tlog.Hash
	reader := tlog.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(idx))
		for i, x := range idx {
			if x < 0 || x >= int64(len(hashes)) {
				return nil, fmt.Errorf("hash %d not stored", x)
			}
			out[i] = hashes[x]
		}
		return out, nil
	})
	for i, e := range entries {
		hs, err := tlog.StoredHashes(int64(i), e, reader)
		if err != nil {
			return nil, err
		}
		hashes = append(hashes, hs...)
	}
	return reader, nil
}

// checkpoints verifies every collected checkpoint's signature and finds
// forks: two checkpoints of one size with different roots.
func checkpoints(r *Report, s *Snapshot, vkey string) []Checkpoint {
	var cps []Checkpoint
	bySize := map[int64]Checkpoint{}
	for _, src := range slices.Sorted(mapsKeys(s.Checkpoints)) {
		cp, err := ParseCheckpoint(s.Checkpoints[src], vkey)
		if errors.Is(err, ErrWrongKey) {
			r.problem("checkpoint signed by another key: %s: %v", src, err)
			continue
		}
		if err != nil {
			r.problem("checkpoint %s: %v", src, err)
			continue
		}
		if prev, ok := bySize[cp.Size]; ok && prev.Root != cp.Root {
			r.problem("forked log: two checkpoints of size %d with different roots (%s, %s): the log key signed two histories; %s", cp.Size, prev.Root, cp.Root, src)
			continue
		}
		bySize[cp.Size] = cp
		cps = append(cps, cp)
	}
	slices.SortFunc(cps, func(a, b Checkpoint) int { return int(a.Size - b.Size) })
	cps = slices.CompactFunc(cps, func(a, b Checkpoint) bool { return a.Size == b.Size })
	r.Checkpoints = len(cps)
	if len(cps) == 0 {
		r.problem("no checkpoint signed by the pinned log key")
		return nil
	}
	r.Latest = cps[len(cps)-1]
	return cps
}

func mapsKeys(m map[string][]byte) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// checkRoots compares every checkpoint with the recomputed tree, naming a
// removed entry (the checkpoint covers more entries than remain) or a
// tampered one (the entries give another root), and proves consistency
// between successive good checkpoints.
func checkRoots(r *Report, cps []Checkpoint, hashes tlog.HashReader) {
	var prev *Checkpoint
	for i := range cps {
		cp := cps[i]
		if cp.Size > r.Entries {
			r.problem("removed entry: the checkpoint of size %d covers %d entries but the log holds %d", cp.Size, cp.Size, r.Entries)
			continue
		}
		root, err := tlog.TreeHash(cp.Size, hashes)
		if err != nil || root != cp.Root {
			from := int64(0)
			if prev != nil {
				from = prev.Size
			}
			r.problem("tampered entry: entries %d..%d do not give the root the checkpoint of size %d signed (an entry in that range was changed, removed or inserted)", from, cp.Size-1, cp.Size)
			continue
		}
		if prev != nil {
			if err := consistent(*prev, cp, hashes); err != nil {
				r.problem("checkpoints of size %d and %d are not consistent: %v", prev.Size, cp.Size, err)
			}
		}
		prev = &cps[i]
	}
}

func consistent(old, cur Checkpoint, hashes tlog.HashReader) error {
	if old.Size == 0 {
		return nil // the empty tree is a prefix of every tree
	}
	p, err := tlog.ProveTree(cur.Size, old.Size, hashes)
	if err != nil {
		return err
	}
	return tlog.CheckTree(p, cur.Size, cur.Root, old.Size, old.Root)
}

// checkEntries decodes every entry, checks an issued certificate's hash,
// finds duplicates, and lints each certificate again.
func checkEntries(r *Report, entries [][]byte) {
	seen := map[string]int{}
	for i, b := range entries {
		e, err := ParseEntry(b)
		if err != nil {
			r.problem("tampered entry %d: %v", i, err)
			continue
		}
		if e.Event != EventIssued {
			continue
		}
		r.Issued++
		if CertSHA256(e.Cert) != e.CertSHA256 {
			r.problem("tampered entry %d: the certificate does not have the SHA-256 the entry names", i)
		}
		if j, dup := seen[e.CertSHA256]; dup {
			r.problem("duplicate entry: certificate %s at entries %d and %d", e.CertSHA256, j, i)
		}
		seen[e.CertSHA256] = i
		lintEntry(r, i, e)
	}
}

// lintEntry runs the lints on a logged certificate without its issuer
// (the log holds leaves, not chains): every lint but the ones comparing
// with the issuer (validity, name constraints) applies.
func lintEntry(r *Report, i int, e Entry) {
	res, err := certlint.Check(e.Cert, certlint.Kind(e.Kind), nil)
	if err != nil {
		r.problem("entry %d: %v", i, err)
		return
	}
	if lerr := res.Err(certlint.Kind(e.Kind)); lerr != nil {
		var le *certlint.Error
		errors.As(lerr, &le)
		r.problem("certificate violating lints in entry %d (serial %s): %s", i, e.Serial, strings.Join(le.Names(), ","))
	}
}

// Find returns the index of the entry of the certificate with DER der.
func Find(s *Snapshot, der []byte) (int64, Entry, error) {
	want := CertSHA256(der)
	for i, b := range s.Entries {
		if !bytes.Contains(b, []byte(want)) {
			continue
		}
		if e, err := ParseEntry(b); err == nil && e.CertSHA256 == want {
			return int64(i), e, nil
		}
	}
	return 0, Entry{}, fmt.Errorf("certificate %s is not in the log", want)
}
