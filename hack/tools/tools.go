//go:build tools

// Package tools pins the versions of the Go tools `make lint` runs, in a
// module of their own so that their dependencies never enter the
// daemon's module graph.
package tools

import (
	_ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
)
