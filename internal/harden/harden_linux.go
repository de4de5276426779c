package harden

import (
	"fmt"

	"golang.org/x/sys/unix"
)

func process() (Status, error) {
	// PR_SET_DUMPABLE 0: no core dump whatever core_pattern says, and
	// /proc/PID/mem and ptrace need CAP_SYS_PTRACE (prctl(2)).
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return Status{}, fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", err)
	}
	// RLIMIT_CORE 0 covers a core_pattern pipe helper (which ignores
	// dumpable only for suid_dumpable=2) and children that re-enable it.
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return Status{}, fmt.Errorf("setrlimit(RLIMIT_CORE, 0): %w", err)
	}
	return current()
}

// current reads back the state, so the log line reports what the kernel
// holds rather than what was asked for.
func current() (Status, error) {
	d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if err != nil {
		return Status{}, fmt.Errorf("prctl(PR_GET_DUMPABLE): %w", err)
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_CORE, &lim); err != nil {
		return Status{}, fmt.Errorf("getrlimit(RLIMIT_CORE): %w", err)
	}
	return Status{Dumpable: d, CoreLimit: max(lim.Cur, lim.Max)}, nil
}

func lock(b []byte) error { return unix.Mlock(b) }

func unlock(b []byte) { _ = unix.Munlock(b) }
