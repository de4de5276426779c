// Package opencryptoki makes throw-away opencryptoki soft tokens for
// tests: Debian's opencryptoki package (IBM's PKCS#11 implementation, the
// usual one on enterprise Linux and s390x) in a private configuration,
// with its slot daemon pkcsslotd started and stopped around every process
// that uses it. It drives pkcsconf and does not need cgo.
//
// opencryptoki 3.8 (Debian 12) has its paths compiled in, with no
// environment variable to move them: /etc/opencryptoki/opencryptoki.conf,
// the token store /var/lib/opencryptoki, the daemon's socket and pid file
// in /var/run, its locks in /var/lock/opencryptoki, and SysV shared memory
// between pkcsslotd and the library. So a wrapped process runs in its own
// mount and IPC namespaces (unshare(1), root only) where those paths are
// bind mounts of this token's directory, and starts its own pkcsslotd
// there. The machine's opencryptoki, if any, is never touched, and tests
// do not share state with each other.
package opencryptoki

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/atomicfile"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11/testtoken"
)

// ModulePath is Debian's opencryptoki PKCS#11 module (amd64).
const ModulePath = "/usr/lib/x86_64-linux-gnu/pkcs11/libopencryptoki.so"

// PINs of test tokens. The SO PIN is opencryptoki's default, which token
// initialisation (pkcsconf -I) asks for. They are fixtures, not secrets.
const (
	DefaultSOPIN = "87654321"
	DefaultPIN   = "12345678"
)

// ErrNotInstalled reports that opencryptoki or unshare(1) is missing.
var ErrNotInstalled = errors.New("opencryptoki is not installed (apt-get install opencryptoki)")

// Available reports whether a token can be made here: the module,
// pkcsslotd and pkcsconf, unshare(1), the pkcs11 group the library checks
// for, and root (for the private mount namespace).
func Available() error {
	if _, err := os.Stat(ModulePath); err != nil {
		return fmt.Errorf("%w: %w", ErrNotInstalled, err)
	}
	for _, tool := range []string{"/usr/sbin/pkcsslotd", "/usr/sbin/pkcsconf"} {
		if _, err := os.Stat(tool); err != nil {
			return fmt.Errorf("%w: %w", ErrNotInstalled, err)
		}
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		return fmt.Errorf("opencryptoki tests need unshare(1) from util-linux: %w", err)
	}
	if os.Geteuid() != 0 {
		return errors.New("opencryptoki tests need root: pkcsslotd's paths are fixed, so each test bind-mounts its own in a private mount namespace")
	}
	if _, err := lookupGroup("pkcs11"); err != nil {
		return fmt.Errorf("%w: %w", ErrNotInstalled, err)
	}
	return nil
}

// Token is an initialised opencryptoki soft token in its own state
// directory.
type Token struct {
	// Fixture's Dir holds the configuration, token store, locks and PIN
	// file.
	testtoken.Fixture
	// Wrapper is an executable that runs its arguments as a command with
	// this token's opencryptoki (see Command).
	Wrapper string
}

// New lays out dir (which must exist and be empty) and initialises a soft
// token labelled label (at most 32 bytes) in it with pkcsconf: -I with the
// default SO PIN, then -u for the user PIN.
func New(dir, label string) (*Token, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	t := &Token{Fixture: testtoken.Fixture{Dir: dir, ModulePath: ModulePath, Label: label, SOPIN: DefaultSOPIN, PIN: DefaultPIN,
		PINFile: filepath.Join(dir, "user.pin")}, Wrapper: filepath.Join(dir, "ock-run")}
	if err := t.layout(); err != nil {
		return nil, err
	}
	// pkcsconf -I reads the label from standard input.
	if _, err := t.run(label+"\n", "pkcsconf", "-I", "-c", "0", "-S", t.SOPIN); err != nil {
		return nil, err
	}
	if _, err := t.run("", "pkcsconf", "-u", "-c", "0", "-S", t.SOPIN, "-n", t.PIN); err != nil {
		return nil, err
	}
	return t, nil
}

// conf is an opencryptoki.conf with the soft token as its only slot.
const conf = "version opencryptoki-3.1\n\nslot 0\n{\nstdll = libpkcs11_sw.so\n}\n"

// wrapper runs "$@" in a mount and IPC namespace of its own where
// opencryptoki's fixed paths are this token's directories, with its own
// pkcsslotd, which it stops when the command ends. SIGINT and SIGTERM
// are passed on to the command, and its exit status is the wrapper's.
const wrapper = `#!/bin/sh
set -e
D=%s
R=$(mktemp -d "$D/run.XXXXXX")
mkdir -p "$R/lock/opencryptoki"
exec unshare --mount --ipc --propagation private -- /bin/sh -ec '
D=$1; R=$2; shift 2
mount --bind "$D/etc" /etc/opencryptoki
mount --bind "$D/lib" /var/lib/opencryptoki
mount --bind "$R" /run
mount --bind "$D/lock" /run/lock/opencryptoki
mount --bind "$D/shm" /dev/shm
/usr/sbin/pkcsslotd
set +e
# An asynchronous command gets /dev/null as stdin unless told otherwise.
exec 3<&0
"$@" <&3 3<&- & child=$!
trap "kill -INT $child" INT
trap "kill -TERM $child" TERM
while :; do
	wait $child; rc=$?
	kill -0 $child 2>/dev/null || break
done
kill "$(cat /run/pkcsslotd.pid)" 2>/dev/null
exit $rc
' sh "$D" "$R" "$@"
`

func (t *Token) layout() error {
	gid, err := lookupGroup("pkcs11")
	if err != nil {
		return err
	}
	// opencryptoki checks that its store and locks belong to group pkcs11.
	for _, d := range []string{"etc", "lib", "lib/swtok", "lib/swtok/TOK_OBJ", "lock", "lock/swtok", "shm"} {
		p := filepath.Join(t.Dir, d)
		if err := os.Mkdir(p, 0o770); err != nil {
			return fmt.Errorf("opencryptoki: %w", err)
		}
		if err := os.Chown(p, 0, gid); err != nil {
			return fmt.Errorf("opencryptoki: %w", err)
		}
	}
	files := []struct {
		path string
		data string
		mode os.FileMode
	}{
		{filepath.Join(t.Dir, "etc", "opencryptoki.conf"), conf, 0o644},
		{t.PINFile, t.PIN + "\n", 0o600},
		{t.Wrapper, fmt.Sprintf(wrapper, shellQuote(t.Dir)), 0o755},
	}
	for _, f := range files {
		if err := atomicfile.Write(f.path, []byte(f.data), f.mode, false); err != nil {
			return fmt.Errorf("opencryptoki: %w", err)
		}
	}
	return nil
}

// Command returns name with args run by the token's wrapper.
func (t *Token) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(t.Wrapper, append([]string{name}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// Wrap writes an executable at dir/name that runs bin under the wrapper
// with the arguments it is given, for harnesses that start a binary by
// path (devtest.StartDaemon).
func (t *Token) Wrap(dir, name, bin string) (string, error) {
	p := filepath.Join(dir, name)
	script := fmt.Sprintf("#!/bin/sh\nexec %s %s \"$@\"\n", shellQuote(t.Wrapper), shellQuote(bin))
	if err := atomicfile.Write(p, []byte(script), 0o755, false); err != nil {
		return "", fmt.Errorf("opencryptoki: %w", err)
	}
	return p, nil
}

func (t *Token) run(stdin, name string, args ...string) (string, error) {
	cmd := t.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		// pkcsconf never prints PINs.
		return string(out), fmt.Errorf("opencryptoki: %s %s: %w: %s", name, args[0], err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Close stops any pkcsslotd a wrapped command left running (one that was
// killed before it could stop its own).
func (t *Token) Close() error {
	pids, _ := filepath.Glob(filepath.Join(t.Dir, "run.*", "pkcsslotd.pid"))
	for _, f := range pids {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || !isPkcsslotd(pid) {
			continue
		}
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	return nil
}

// isPkcsslotd reports whether pid is a pkcsslotd, so that a recycled pid
// is never signalled.
func isPkcsslotd(pid int) bool {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.TrimSpace(string(comm)) == "pkcsslotd"
}

// NewTest makes a token in a temporary directory and stops its daemons at
// the end of the test. Without opencryptoki it fails the test when
// devtest.Required(), and skips it otherwise.
func NewTest(tb testing.TB, label string) *Token {
	tb.Helper()
	devtest.NeedAvailable(tb, "opencryptoki", Available())
	tok, err := New(tb.TempDir(), label)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tok.Close() })
	return tok
}

func lookupGroup(name string) (int, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, fmt.Errorf("%w (the opencryptoki package creates it)", err)
	}
	return strconv.Atoi(g.Gid)
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
