//go:build unix

package keystore

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/steward-trustd/steward-trustd/internal/atomicfile"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
)

// Lock implements Locker with flock(2) on the directory itself (creating
// it first): the kernel releases the lock when the process dies, so a
// killed ceremony never leaves the directory locked, and no lock file is
// left in it.
func (d OSDir) Lock() (unlock func(), removed []string, err error) {
	if err := os.MkdirAll(d.Root, 0o700); err != nil {
		return nil, nil, fmt.Errorf("create %s: %w", d.Root, err)
	}
	f, err := os.Open(d.Root)
	if err != nil {
		return nil, nil, fmt.Errorf("lock %s: %w", d.Root, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close() // opened read-only, for the lock alone
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil, fmt.Errorf("%w: %s (wait for it to finish)", ErrBusy, d.Root)
		}
		return nil, nil, fmt.Errorf("lock %s: %w", d.Root, err)
	}
	// Closing the descriptor releases the lock (flock(2)), even when
	// close reports an error.
	unlock = func() { _ = f.Close() }
	for _, sub := range []string{d.Root, d.Path(certdir.DirReceipts)} {
		r, err := atomicfile.RemoveStaleTemps(sub)
		removed = append(removed, r...)
		if err != nil {
			unlock()
			return nil, removed, err
		}
	}
	return unlock, removed, nil
}
