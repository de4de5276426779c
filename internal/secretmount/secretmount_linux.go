package secretmount

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// tmpfsMagic is TMPFS_MAGIC from linux/magic.h (statfs(2)).
const tmpfsMagic = 0x01021994

func fileOwner(st fs.FileInfo) (uid, gid int, ok bool) {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return int(sys.Uid), int(sys.Gid), true
}

// checkTmpfs: kubelet mounts Secret volumes on tmpfs.
func checkTmpfs(f *os.File) error {
	var sfs syscall.Statfs_t
	if err := syscall.Fstatfs(int(f.Fd()), &sfs); err != nil {
		return fmt.Errorf("%w: statfs: %w", ErrNotSecretMount, err)
	}
	if sfs.Type != tmpfsMagic {
		return fmt.Errorf("%w: not on tmpfs", ErrNotSecretMount)
	}
	return nil
}
