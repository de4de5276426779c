//go:build !linux

package secretmount

import (
	"fmt"
	"io/fs"
	"os"
)

func fileOwner(fs.FileInfo) (uid, gid int, ok bool) { return 0, 0, false }

// checkTmpfs: Secret volumes as kubelet mounts them exist on Linux only.
func checkTmpfs(*os.File) error {
	return fmt.Errorf("%w: only on Linux", ErrNotSecretMount)
}
