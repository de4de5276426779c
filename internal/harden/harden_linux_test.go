package harden

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// envChild makes the test binary a crashing child: "plain" crashes as
// is, "hardened" calls Process first.
const envChild = "HARDEN_TEST_CHILD"

// secret is what a core of the child would hold.
const secret = "steward-harden-test-secret-0123456789"

// coreCap bounds the children's cores: a plain test binary's is ~75 MB;
// a race build's would be several GB (its shadow memory), so there a
// truncated core shows that cores are written.
func coreCap() uint64 {
	if raceBuild {
		return 1 << 20
	}
	return 128 << 20
}

// TestCrashChild is the child of TestCrashLeavesNoCore; alone it does
// nothing.
func TestCrashChild(t *testing.T) {
	mode := os.Getenv(envChild)
	if mode == "" {
		return
	}
	if mode == "hardened" {
		st, err := Process()
		if err != nil || st != (Status{Dumpable: 0, CoreLimit: 0}) {
			t.Fatalf("Process: %+v, %v", st, err)
		}
	}
	held := bytes.Repeat([]byte(secret), 4) // on the heap, as a token is
	_ = syscall.Kill(os.Getpid(), syscall.SIGABRT)
	time.Sleep(5 * time.Second)
	t.Fatalf("still alive holding %d bytes", len(held))
}

// TestCrashLeavesNoCore crashes a child with GOTRACEBACK=crash and
// SIGABRT, with RLIMIT_CORE raised to its hard limit: the unhardened
// child is the control (it must leave a core holding the secret, else
// the machine's core_pattern writes cores elsewhere and the test says
// so), the hardened child must leave none.
func TestCrashLeavesNoCore(t *testing.T) {
	if os.Getenv(envChild) != "" {
		return
	}
	raiseCoreLimit(t)
	plain := crashChild(t, "plain")
	if len(plain) == 0 {
		pattern, _ := os.ReadFile("/proc/sys/kernel/core_pattern")
		t.Logf("control child left no core in its directory (core_pattern %q): only the limits are checked", strings.TrimSpace(string(pattern)))
	} else if uint64(len(plain[0])) >= coreCap() {
		t.Logf("control core truncated at %d bytes (a race build): cores are written, the secret is not looked for", coreCap())
	} else if !bytes.Contains(plain[0], []byte(secret)) {
		t.Fatalf("control core does not hold the secret: the test would prove nothing")
	}
	if hardened := crashChild(t, "hardened"); len(hardened) != 0 {
		t.Fatalf("hardened child left %d core file(s)", len(hardened))
	}
}

// crashChild runs the child in a fresh directory and returns the content
// of the core files it left there.
func crashChild(t *testing.T, mode string) [][]byte {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), envChild+"="+mode, "GOTRACEBACK=crash")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGABRT {
		t.Fatalf("%s child did not die of SIGABRT: %v\n%s", mode, err, out)
	}
	cores, _ := filepath.Glob(filepath.Join(dir, "core*"))
	var data [][]byte
	for _, c := range cores {
		b, err := os.ReadFile(c)
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, b)
	}
	return data
}

// raiseCoreLimit lets children dump cores of up to coreCap bytes (soft
// limit; never above the hard one) for the test's duration.
func raiseCoreLimit(t *testing.T) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_CORE, &old); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{Cur: min(old.Max, coreCap()), Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_CORE, &old) })
}

func TestLock(t *testing.T) {
	if err := Lock(make([]byte, MaxLocked+1)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized buffer: %v", err)
	}
	if err := Lock(nil); err != nil {
		t.Errorf("empty buffer: %v", err)
	}
	b := make([]byte, 4096)
	if err := Lock(b); err != nil {
		t.Fatalf("lock one page: %v", err)
	}
	Unlock(b)
}
