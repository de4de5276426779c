package issuelog

import (
	"fmt"

	"golang.org/x/mod/sumdb/tlog"
)

// Inclusion is an RFC 6962 §2.1.1 inclusion proof of one entry in the
// tree of a signed checkpoint.
type Inclusion struct {
	Index      int64       `json:"index"`
	TreeSize   int64       `json:"treeSize"`
	Root       tlog.Hash   `json:"root"`
	LeafHash   tlog.Hash   `json:"leafHash"`
	Proof      []tlog.Hash `json:"proof"`
	Checkpoint string      `json:"checkpoint"`
}

// Prove proves that entry index of s is in the tree of cp (verified by
// the caller) and checks the proof against cp's root before returning it.
func Prove(s *Snapshot, index int64, cp Checkpoint) (*Inclusion, error) {
	if index < 0 || index >= cp.Size || cp.Size > int64(len(s.Entries)) {
		return nil, fmt.Errorf("entry %d is not covered by the checkpoint of size %d yet (the log holds %d entries): retry after the next checkpoint (one a second)", index, cp.Size, len(s.Entries))
	}
	hashes, err := treeHashes(s.Entries[:cp.Size])
	if err != nil {
		return nil, err
	}
	p, err := tlog.ProveRecord(cp.Size, index, hashes)
	if err != nil {
		return nil, fmt.Errorf("prove entry %d: %w", index, err)
	}
	in := &Inclusion{Index: index, TreeSize: cp.Size, Root: cp.Root, LeafHash: tlog.RecordHash(s.Entries[index]), Proof: p, Checkpoint: string(cp.Raw)}
	if err := in.Check(); err != nil {
		return nil, err
	}
	return in, nil
}

// Check verifies the proof against its root.
func (in *Inclusion) Check() error {
	if err := tlog.CheckRecord(in.Proof, in.TreeSize, in.Root, in.Index, in.LeafHash); err != nil {
		return fmt.Errorf("inclusion proof of entry %d in the tree of size %d: %w", in.Index, in.TreeSize, err)
	}
	return nil
}
