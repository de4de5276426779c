//go:build steward_crashpoints

package crashpoint

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// Enabled reports whether this build honours crash points.
const Enabled = true

// At records step in the trace file named by EnvTrace (if set) and kills
// the process with SIGKILL when it is the EnvKillAt-th step recorded. The
// state lives in the trace file, not in the process, so the numbering is
// the same in every run of the same command.
func At(step string) {
	path := os.Getenv(EnvTrace)
	if path == "" {
		return
	}
	n, err := record(path, step)
	if err != nil {
		fmt.Fprintf(os.Stderr, "crashpoint: %v\n", err)
		os.Exit(3)
	}
	if want, err := strconv.Atoi(os.Getenv(EnvKillAt)); err == nil && want == n {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		for { // the signal is delivered on the way out of kill(2)
			time.Sleep(time.Second)
		}
	}
}

// record appends step to the trace and returns its number.
func record(path, step string) (int, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if _, err := f.WriteString(step + "\n"); err != nil {
		return 0, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return bytes.Count(data, []byte("\n")), nil
}
