//go:build !unix

package issuelog

import "os"

// lockFile is a no-op where flock does not exist.
func lockFile(*os.File) error { return nil }
