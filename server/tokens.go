package server

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
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

// fingerprintLen is how many hex digits of a token's SHA-256 name it in
// metrics and logs: enough to tell a handful of tokens apart, and of a
// 256-bit random token's hash, no help to a guesser.
const fingerprintLen = 16

// fingerprint names token i: the first 16 hex digits of the SHA-256 of
// the token line (printf %s "$TOKEN" | sha256sum | cut -c1-16), never the
// token itself.
func (ts tokenSet) fingerprint(i int) string {
	return hex.EncodeToString(ts.digests[i][:])[:fingerprintLen]
}

// fingerprints names every token, in file order.
func (ts tokenSet) fingerprints() []string {
	out := make([]string, len(ts.digests))
	for i := range ts.digests {
		out[i] = ts.fingerprint(i)
	}
	return out
}

// shares reports whether ts and other have a token in common.
func (ts tokenSet) shares(other tokenSet) bool {
	for _, d := range other.digests {
		if slices.Contains(ts.digests, d) {
			return true
		}
	}
	return false
}

// reloadToken is the trustd_reload_failed label of a token file refused
// because it shares no token with the running set.
const reloadToken = "token"

// TokenError refuses a token file that shares no token with the running
// set: every worker would be refused at once. The classic cause is a
// token appended to a file without a trailing newline, which makes one
// long token of the two.
type TokenError struct {
	// Running and Next are the fingerprints of both sets.
	Running, Next []string
}

func (e *TokenError) Error() string {
	return fmt.Sprintf("the new token file shares no token with the running set (running %s, new %s): every worker would be refused. "+
		"Add a new token on a line of its own (the file must end with a newline before `openssl rand -hex 32 >> token`; "+
		"a token glued to the last line is one long token), or, to replace every token on purpose, set TRUSTD_TOKEN_RELOAD_FORCE=true or restart",
		strings.Join(e.Running, ","), strings.Join(e.Next, ","))
}

// checkTokenChange refuses next unless it keeps a running token or force
// is set.
func checkTokenChange(running, next tokenSet, force bool) error {
	if force || next.shares(running) {
		return nil
	}
	return &TokenError{Running: running.fingerprints(), Next: next.fingerprints()}
}
