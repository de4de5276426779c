// Package crashpoint names the steps at which the ceremony can be
// interrupted, so that a test can kill the real binary at every one of
// them and check that a re-run recovers.
//
// At is a no-op unless the binary was built with the build tag
// steward_crashpoints (see crashpoint_enabled.go); release builds cannot
// be made to kill themselves, whatever their environment holds.
package crashpoint

// Environment variables read by a binary built with the steward_crashpoints
// tag (and by no other build).
const (
	// EnvTrace names a file to which every step reached is appended, one
	// name a line; the line count is the step's number.
	EnvTrace = "STEWARD_CRASHPOINT_TRACE"
	// EnvKillAt is the number of the step (1-based, counted in the trace
	// file) at which the process sends itself SIGKILL, after recording it.
	EnvKillAt = "STEWARD_CRASHPOINT_KILL_AT"
)
