package server

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
)

// maxTokens bounds the token set: rotation needs two or three at once.
const maxTokens = 16

// tokenSet holds the worker tokens that are valid at the same time, so a
// token can be rotated without an outage: add the new one, move every
// machine config over, then remove the old one (siderolabs/talos#11594).
// Only SHA-256 digests are kept for comparison.
type tokenSet struct {
	digests [][sha256.Size]byte
}

// parseTokens reads one token per line; blank lines are skipped, and
// surrounding space is trimmed.
func parseTokens(b []byte) (tokenSet, error) {
	var ts tokenSet
	for _, line := range bytes.Split(b, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		ts.digests = append(ts.digests, sha256.Sum256(line))
	}
	switch {
	case len(ts.digests) == 0:
		return ts, errors.New("token is empty")
	case len(ts.digests) > maxTokens:
		return ts, errors.New("more than 16 tokens; keep only those workers still use")
	}
	return ts, nil
}

// match returns the index of the token equal to got, or -1. Every token is
// compared, in constant time, whatever matches: the time taken does not
// tell which token matched, nor how close a guess came. Both sides are
// hashed first so that not even the length leaks.
func (ts tokenSet) match(got []byte) int {
	d := sha256.Sum256(got)
	found := -1
	for i := range ts.digests {
		eq := subtle.ConstantTimeCompare(d[:], ts.digests[i][:])
		found = subtle.ConstantTimeSelect(eq, i, found)
	}
	return found
}

// len is the number of valid tokens.
func (ts tokenSet) len() int { return len(ts.digests) }
