package opencryptoki

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNew: the token pkcsconf initialised is listed by p11tool (GnuTLS,
// not ours) through the module, and the wrapper stops the pkcsslotd it
// started.
func TestNew(t *testing.T) {
	tok := NewTest(t, "matrix")
	out, err := tok.run("", "p11tool", "--provider", tok.ModulePath, "--list-tokens")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "Label: matrix") || !strings.Contains(out, "Requires login") {
		t.Fatalf("p11tool does not list the token:\n%s", out)
	}
	pids, _ := filepath.Glob(filepath.Join(tok.Dir, "run.*", "pkcsslotd.pid"))
	if len(pids) == 0 {
		t.Fatal("no pkcsslotd was started")
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, f := range pids {
		b, _ := os.ReadFile(f)
		for pidRunning(strings.TrimSpace(string(b))) {
			if time.Now().After(deadline) {
				t.Fatalf("pkcsslotd %s still running after its command ended", b)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// pidRunning reports whether a pkcsslotd with that pid is alive (not a
// zombie).
func pidRunning(pid string) bool {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	return err == nil && !strings.Contains(string(b), ") Z ")
}
