package issuelog

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Checkpoint is a verified C2SP tlog-checkpoint.
type Checkpoint struct {
	Origin string
	Size   int64
	Root   tlog.Hash
	// Raw is the signed note as read.
	Raw []byte
}

// ErrWrongKey reports a checkpoint that the pinned log key did not sign.
var ErrWrongKey = errors.New("checkpoint not signed by the pinned log key")

// ParseCheckpoint verifies a signed checkpoint with the verifier key vkey
// (as NoteSigner.Verifier prints it) and parses its body.
func ParseCheckpoint(raw []byte, vkey string) (Checkpoint, error) {
	v, err := NewVerifier(vkey)
	if err != nil {
		return Checkpoint{}, err
	}
	n, err := note.Open(raw, note.VerifierList(v))
	if err != nil {
		var unknown *note.UnverifiedNoteError
		if errors.As(err, &unknown) {
			return Checkpoint{}, fmt.Errorf("%w (%s)", ErrWrongKey, signers(unknown))
		}
		return Checkpoint{}, fmt.Errorf("%w: %w", ErrWrongKey, err)
	}
	cp, err := parseBody(n.Text)
	if err != nil {
		return Checkpoint{}, err
	}
	if cp.Origin != v.Name() {
		return Checkpoint{}, fmt.Errorf("checkpoint origin %q is not the log key's name %q", cp.Origin, v.Name())
	}
	cp.Raw = raw
	return cp, nil
}

// signers names the keys that did sign a note nobody trusted.
func signers(e *note.UnverifiedNoteError) string {
	if e == nil || e.Note == nil {
		return "no signature"
	}
	var names []string
	for _, s := range e.Note.UnverifiedSigs {
		names = append(names, fmt.Sprintf("%s+%08x", s.Name, s.Hash))
	}
	return "signed by " + strings.Join(names, ", ")
}

func parseBody(text string) (Checkpoint, error) {
	lines := strings.SplitN(text, "\n", 4)
	if len(lines) < 4 {
		return Checkpoint{}, errors.New("checkpoint: want origin, size and root lines")
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil || size < 0 {
		return Checkpoint{}, fmt.Errorf("checkpoint: bad size %q", lines[1])
	}
	root, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(root) != tlog.HashSize {
		return Checkpoint{}, fmt.Errorf("checkpoint: bad root hash %q", lines[2])
	}
	return Checkpoint{Origin: lines[0], Size: size, Root: tlog.Hash(root)}, nil
}
