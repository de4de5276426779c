// Package harden keeps the process's secrets (worker tokens, PINs, a
// file-backed CA key) out of core dumps and, where the platform allows,
// out of swap.
package harden

import (
	"errors"
	"fmt"
	"io"
)

// MaxLocked bounds what Lock pins in memory: a PEM key file is at most a
// few KiB; anything bigger is not key material and must not eat the
// RLIMIT_MEMLOCK budget.
const MaxLocked = 64 << 10

// ErrTooLarge is returned by Lock for a buffer over MaxLocked.
var ErrTooLarge = errors.New("buffer too large to lock in memory")

// Status is what Process found and set, for the start-up log line.
type Status struct {
	// Dumpable is prctl(PR_GET_DUMPABLE) after the change (0 = no core
	// dump, no ptrace by other users' processes, /proc/PID/mem closed).
	Dumpable int
	// CoreLimit is RLIMIT_CORE's soft and hard limit after the change.
	CoreLimit uint64
}

// Process makes the running process non-dumpable and sets its core file
// size limit to 0 (soft and hard), so that neither a crash, nor
// SIGQUIT/SIGABRT with GOTRACEBACK=crash, nor gcore by another user writes
// its memory to disk. Call it first thing in main. It returns the state
// it left, or an error saying what it could not change.
func Process() (Status, error) {
	st, err := process()
	if err != nil {
		return st, fmt.Errorf("process hardening: %w", err)
	}
	return st, nil
}

// Lock pins b (at most MaxLocked bytes) in RAM so that it is never
// written to swap. b stays locked until Unlock or exit; an error says why
// (typically RLIMIT_MEMLOCK) and the caller warns and carries on.
func Lock(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if len(b) > MaxLocked {
		return fmt.Errorf("%w (%d bytes, limit %d)", ErrTooLarge, len(b), MaxLocked)
	}
	if err := lock(b); err != nil {
		return fmt.Errorf("mlock %d bytes: %w (raise RLIMIT_MEMLOCK, e.g. LimitMEMLOCK= in the systemd unit, or disable swap)", len(b), err)
	}
	return nil
}

// Unlock undoes Lock after the caller has zeroed b.
func Unlock(b []byte) {
	if len(b) > 0 && len(b) <= MaxLocked {
		unlock(b)
	}
}

// AtStart runs Process for the command prog and writes one warning line
// to w if it failed: the command still runs (a missing prctl is not a
// reason to refuse to sign), but the operator learns that a crash could
// dump secrets and what to do.
func AtStart(w io.Writer, prog string) {
	if _, err := Process(); err != nil {
		fmt.Fprintf(w, "%s: warning: %v; a core dump could hold the token or key material: set `ulimit -c 0` (LimitCORE=0 in systemd) before starting it\n", prog, err)
	}
}
