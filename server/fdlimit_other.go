//go:build !linux

package server

import "log/slog"

// checkFileLimit is Linux-only (RLIMIT_NOFILE as the daemon's platform
// sets it); elsewhere the operator sizes the limit.
func checkFileLimit(int, *slog.Logger) {}
