//go:build unix

package issuelog

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive lock on the entries file: two daemons
// appending to one log would interleave their trees.
func lockFile(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}
