// Package secretmount recognises a file that a Kubernetes Secret volume
// made group-readable for the pod's fsGroup, so that the file signer (CA
// key) and the PKCS#11 backend (PIN file) can accept it, and nothing else
// that group or others may read.
package secretmount

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// A Kubernetes Secret volume mounted with a pod fsGroup cannot give the
// key mode 0400: kubelet adds group read for the fsGroup, so
// `defaultMode: 0400` becomes 0440 (kubernetes/kubernetes#57923), and
// without fsGroup the files stay root-owned 0400, which the non-root
// daemon cannot read. The file signer therefore accepts group read, and
// nothing more, when all of these hold:
//
//   - the mode grants the group read only, others nothing (0440 or 0640);
//   - the group is this process's own (effective) group — the manifests
//     set fsGroup = runAsGroup — not merely a supplementary one, which on a
//     host may be shared with other services (tss); the owner is root
//     (kubelet) or this process;
//   - the file is a Secret projection as kubelet's atomic writer lays it
//     out: DIR/NAME -> ..data/NAME, DIR/..data -> ..<timestamp>, and the
//     opened file is DIR/..data/NAME;
//   - it lives on tmpfs, where kubelet puts every Secret volume.
//
// That grants no principal access it would not have anyway: in a pod the
// group's members are the pod's own containers, which can mount the
// Secret themselves. On a host, a file shared with a
// group still needs `chmod 600` — the layout is not what `install`,
// `cp` or a ceremony write.
const (
	atomicWriterData = "..data"
	secretGroupPerm  = 0o040
)

// ErrNotSecretMount says why a group-readable file is not accepted.
var ErrNotSecretMount = errors.New("not a Kubernetes Secret mount readable by this process's fsGroup")

// Check returns nil when the group-readable file f, opened from path with
// metadata st, is accepted under the rule above; otherwise an error
// wrapping ErrNotSecretMount that says which condition failed.
func Check(path string, f *os.File, st fs.FileInfo) error {
	if perm := st.Mode().Perm(); perm&0o077 != secretGroupPerm {
		return fmt.Errorf("%w: mode %04o is not owner + group read only", ErrNotSecretMount, perm)
	}
	if err := checkOwnGroup(st); err != nil {
		return err
	}
	if err := checkAtomicWriterLayout(path, st); err != nil {
		return err
	}
	return checkTmpfs(f)
}

// checkOwnGroup: owned by root or us, group our effective group.
func checkOwnGroup(st fs.FileInfo) error {
	uid, gid, ok := fileOwner(st)
	if !ok {
		return fmt.Errorf("%w: file owner unknown", ErrNotSecretMount)
	}
	if uid != 0 && uid != os.Geteuid() {
		return fmt.Errorf("%w: owner uid %d is neither root nor this process", ErrNotSecretMount, uid)
	}
	if gid != os.Getegid() {
		return fmt.Errorf("%w: group %d is not this process's group %d (set the pod's fsGroup equal to its runAsGroup)", ErrNotSecretMount, gid, os.Getegid())
	}
	return nil
}

// checkAtomicWriterLayout checks DIR/NAME -> ..data/NAME, DIR/..data ->
// ..<timestamp> and that st is the file behind them.
func checkAtomicWriterLayout(path string, st fs.FileInfo) error {
	dir, name := filepath.Split(path)
	if target, err := os.Readlink(path); err != nil || target != atomicWriterData+"/"+name {
		return fmt.Errorf("%w: %s is not a symlink to %s/%s", ErrNotSecretMount, path, atomicWriterData, name)
	}
	data, err := os.Readlink(filepath.Join(dir, atomicWriterData))
	if err != nil || !strings.HasPrefix(data, "..") || data == atomicWriterData || strings.ContainsRune(data, '/') {
		return fmt.Errorf("%w: %s is not a symlink to a ..<timestamp> directory", ErrNotSecretMount, filepath.Join(dir, atomicWriterData))
	}
	behind, err := os.Lstat(filepath.Join(dir, data, name))
	if err != nil || !os.SameFile(behind, st) {
		return fmt.Errorf("%w: the opened file is not %s (volume updated meanwhile? restart)", ErrNotSecretMount, filepath.Join(dir, data, name))
	}
	return nil
}
