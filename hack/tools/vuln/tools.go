//go:build tools

// Package vuln pins govulncheck and the Go vulnerability database that
// `make vulncheck` (part of `make lint`) checks against, in a module of
// their own: the database's tools bring a large dependency graph that must
// not move golangci-lint's pins in hack/tools. The database is the OSV
// data of the golang.org/x/vulndb module (data/osv), indexed by its
// indexdb command: a snapshot that the Go module proxy serves, so the
// check runs without internet access. Refresh it with
// `go get golang.org/x/vulndb@latest && go mod tidy` here.
package vuln

import (
	_ "golang.org/x/vuln/cmd/govulncheck"
	_ "golang.org/x/vulndb/cmd/indexdb"
)
