package ceremony_test

import (
	"bytes"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/crashpoint"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/keystore"
)

// killScenario is a ceremony operation to kill at every step.
type killScenario struct {
	name string
	// prepare readies root with the normal binary and returns the
	// arguments of the operation under test.
	prepare func(t *testing.T, root string) []string
	// keys is how many key files root/keys holds afterwards.
	keys int
	// op is the receipt of the operation, keyOp the receipt of the key it
	// creates (if any), cert the file whose certificate op records (none
	// for a certificate request).
	op, keyOp, cert string
	// approvals is how many approvals root/approvals holds afterwards,
	// each with one policy.approve receipt.
	approvals int
	// remakes means a completed operation is made again by a re-run (a
	// certificate request), instead of being reported complete.
	remakes bool
}

func fileKey(root, name string) string { return "file:" + filepath.Join(root, "keys", name+".key") }

func initArgs(root string) []string {
	return []string{"init", "--signer", fileKey(root, "old"), "--cluster", "kill", "--out", filepath.Join(root, "out")}
}

func rotateArgs(root string) []string {
	return []string{"rotate", "--signer", fileKey(root, "old"), "--new-signer", fileKey(root, "new"), "--out", filepath.Join(root, "out")}
}

var killScenarios = []killScenario{
	{
		name:    "init",
		prepare: func(t *testing.T, root string) []string { return initArgs(root) },
		keys:    1, op: "init", keyOp: "init.key", cert: certdir.FileCACert,
	},
	{
		name: "import",
		prepare: func(t *testing.T, root string) []string {
			src := filepath.Join(root, "src")
			runTool(t, filepath.Join(binDir, "steward-trustd-gencreds"), "-cluster", "kill", "-output", src)
			return []string{"import", "--signer", fileKey(root, "old"), "--key", filepath.Join(src, "os-ca.key"), "--cert", filepath.Join(src, "os-ca.crt"), "--out", filepath.Join(root, "out")}
		},
		keys: 1, op: "import", cert: certdir.FileCACert,
	},
	{
		name: "rotate",
		prepare: func(t *testing.T, root string) []string {
			mustCeremony(t, nil, initArgs(root)...)
			return rotateArgs(root)
		},
		keys: 2, op: "rotate", keyOp: "rotate.key", cert: certdir.FileNextCACert,
	},
	{
		name: "rotate --finish",
		prepare: func(t *testing.T, root string) []string {
			out := filepath.Join(root, "out")
			mustCeremony(t, nil, initArgs(root)...)
			mustCeremony(t, nil, "server-cert", "--signer", fileKey(root, "old"), "--ca", filepath.Join(out, certdir.FileCACert), "--san", "127.0.0.1", "--out", out)
			mustCeremony(t, nil, rotateArgs(root)...)
			return append(rotateArgs(root), "--finish")
		},
		keys: 2, op: "rotate.finish", cert: certdir.FileCACert,
	},
	{
		name: "trust add",
		prepare: func(t *testing.T, root string) []string {
			out := filepath.Join(root, "out")
			mustCeremony(t, nil, initArgs(root)...)
			ca, _ := devtest.SelfSignedCA(t, "vouched")
			writeFile(t, filepath.Join(root, "vouched.crt"), pki.EncodeCertificates(ca))
			return []string{"trust", "add", "--signer", fileKey(root, "old"), "--ca", filepath.Join(out, certdir.FileCACert), "--out", out, filepath.Join(root, "vouched.crt")}
		},
		keys: 1, op: "trust.add", cert: certdir.FileAcceptedCAs,
	},
}

// TestKilledAtEveryStep kills the real binary with SIGKILL at every step
// of init, import, rotate, rotate --finish and trust add (file backend), one step
// per run, re-runs the same command and checks that it completes with
// exactly the keys it should have made, no temporary or orphan files, and
// receipts that match the files. The steps are the crash points of a
// binary built with the steward_crashpoints tag (internal/crashpoint).
func TestKilledAtEveryStep(t *testing.T) {
	for _, sc := range killScenarios {
		t.Run(sc.name, func(t *testing.T) { runKillScenario(t, sc) })
	}
}

// runKillScenario prepares sc and kills its operation at every step,
// checking each re-run and a third run.
func runKillScenario(t *testing.T, sc killScenario) {
	t.Helper()
	tmpl := t.TempDir()
	if err := os.Mkdir(filepath.Join(tmpl, "keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	args := sc.prepare(t, tmpl)
	steps := killAtEveryStep(t, tmpl, args, 5, func(root string, a []string, step string) {
		checkAfterKill(t, root, sc, step)
		checkThirdRun(t, root, sc, step, a)
	})
	t.Logf("%s: killed at each of %d steps, every re-run completed", sc.name, len(steps))
}

// checkThirdRun runs the completed operation once more: it is reported
// complete, or (remakes) made again from the same key and approval.
func checkThirdRun(t *testing.T, root string, sc killScenario, step string, args []string) {
	t.Helper()
	r := ceremony(t, nil, args...)
	switch {
	case r.code != 0:
		t.Errorf("killed at step %s: a third run failed: %s", step, r)
	case sc.remakes:
		checkAfterKill(t, root, sc, step+" (third run)")
	case !strings.Contains(r.stdout, "already completed"):
		t.Errorf("killed at step %s: a third run did not find the operation complete: %s", step, r)
	}
}

// killAtEveryStep traces the crash points of the ceremony command args
// run on tmpl (at least minSteps), then for each step runs it on a fresh
// copy of tmpl killed at that step, re-runs it to completion and calls
// check with the copy, the rebased arguments and the step. It returns the
// steps.
func killAtEveryStep(t *testing.T, tmpl string, args []string, minSteps int, check func(root string, a []string, step string)) []string {
	t.Helper()
	steps := crashTrace(t, tmpl, args)
	if len(steps) < minSteps {
		t.Fatalf("only %d crash points traced: %v", len(steps), steps)
	}
	for i, step := range steps {
		root := copyTree(t, tmpl)
		a := rebase(args, tmpl, root)
		if r, killed, _ := crashRun(t, root, i+1, a); !killed {
			t.Fatalf("step %d (%s): not killed: %s", i+1, step, r)
		}
		if r := ceremony(t, nil, a...); r.code != 0 {
			t.Fatalf("killed at step %d (%s), the re-run failed: %s", i+1, step, r)
		}
		check(root, a, step)
	}
	return steps
}

// TestKilledAtRandom kills init at random moments, several times in a
// row, for a bounded time, and checks that a final run completes cleanly.
func TestKilledAtRandom(t *testing.T) {
	deadline := time.Now().Add(3 * time.Second)
	series := 0
	for time.Now().Before(deadline) {
		root := t.TempDir()
		if err := os.Mkdir(filepath.Join(root, "keys"), 0o700); err != nil {
			t.Fatal(err)
		}
		args := initArgs(root)
		for range 8 {
			killAfter(t, args, time.Duration(rand.IntN(40_000))*time.Microsecond)
		}
		if r := ceremony(t, nil, args...); r.code != 0 {
			t.Fatalf("series %d: the run after random kills failed: %s", series, r)
		}
		checkAfterKill(t, root, killScenarios[0], "random")
		series++
	}
	t.Logf("%d series of 8 random kills, all resumed", series)
}

// crashTrace runs args once in a copy of tmpl with a trace and returns the
// crash points reached, in order.
func crashTrace(t *testing.T, tmpl string, args []string) []string {
	t.Helper()
	root := copyTree(t, tmpl)
	r, killed, steps := crashRun(t, root, 0, rebase(args, tmpl, root))
	if killed || r.code != 0 {
		t.Fatalf("trace run: %s", r)
	}
	return steps
}

// crashRun runs the crash-point binary, to be killed at step killAt (0:
// never), reports whether SIGKILL ended it and returns the steps reached.
func crashRun(t *testing.T, root string, killAt int, args []string) (result, bool, []string) {
	t.Helper()
	trace := filepath.Join(t.TempDir(), "trace")
	cmd := exec.Command(filepath.Join(binDir, "crash", "steward-trustd-ceremony"), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + root, crashpoint.EnvTrace + "=" + trace, crashpoint.EnvKillAt + "=" + strconv.Itoa(killAt)}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	data, _ := os.ReadFile(trace)
	steps := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	return result{cmd.ProcessState.ExitCode(), out.String(), errb.String()}, ws.Signaled() && ws.Signal() == syscall.SIGKILL, steps
}

// killAfter starts the normal binary and kills it after d (if it has not
// finished by then).
func killAfter(t *testing.T, args []string, d time.Duration) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "steward-trustd-ceremony"), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(d)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// checkAfterKill checks root after a killed run and its completed re-run.
func checkAfterKill(t *testing.T, root string, sc killScenario, step string) {
	t.Helper()
	checkLeftovers(t, root, sc, step)
	d := keystore.OSDir{Root: filepath.Join(root, "out")}
	rs, err := keystore.ReadReceipts(d)
	if err != nil {
		t.Fatalf("killed at %s: receipts: %v", step, err)
	}
	count := map[string]int{}
	var last keystore.Receipt
	for _, r := range rs {
		count[string(r.Operation)]++
		if string(r.Operation) == sc.op {
			last = r
		}
	}
	if sc.keyOp != "" && count[sc.keyOp] != 1 {
		t.Errorf("killed at %s: %d %q receipts, want 1", step, count[sc.keyOp], sc.keyOp)
	}
	if count[sc.op] < 1 {
		t.Fatalf("killed at %s: no %q receipt", step, sc.op)
	}
	checkApprovals(t, root, sc, step, count["policy.approve"])
	if sc.cert != "" {
		checkRecordedCert(t, d, sc, step, last)
	}
	checkReceiptFiles(t, d, step, last)
}

// checkLeftovers checks that root/keys holds sc.keys files and that no
// temporary file or intent record is left anywhere.
func checkLeftovers(t *testing.T, root string, sc killScenario, step string) {
	t.Helper()
	keyDir := filepath.Join(root, "keys")
	keys, err := os.ReadDir(keyDir)
	if err != nil || len(keys) != sc.keys {
		t.Errorf("killed at %s: keys %v (%v), want %d key files", step, names(keys), err, sc.keys)
	}
	_ = filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err == nil && (strings.Contains(e.Name(), ".tmp-") || strings.HasSuffix(e.Name(), ".intent")) {
			t.Errorf("killed at %s: left %s", step, p)
		}
		return nil
	})
}

// checkReceiptFiles checks that every file the receipt last lists is in
// d and present, or absent if listed as removed.
func checkReceiptFiles(t *testing.T, d keystore.OSDir, step string, last keystore.Receipt) {
	t.Helper()
	for _, f := range last.Files {
		removed := strings.HasPrefix(f, "-")
		p := strings.TrimPrefix(f, "-")
		if !filepath.IsAbs(p) || filepath.Dir(p) != d.Path(".") {
			t.Errorf("killed at %s: the receipt lists %s, want an absolute path in %s", step, f, d.Path("."))
		}
		_, err := os.Stat(p)
		ok := err == nil
		if ok == removed {
			t.Errorf("killed at %s: the receipt lists %s, but present = %v", step, f, ok)
		}
	}
}

// checkApprovals checks that root/approvals holds sc.approvals approvals,
// each recorded once.
func checkApprovals(t *testing.T, root string, sc killScenario, step string, receipts int) {
	t.Helper()
	files, err := os.ReadDir(filepath.Join(root, "approvals"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	if len(files) != sc.approvals || receipts != sc.approvals {
		t.Errorf("killed at %s: approvals %v with %d policy.approve receipts, want %d of each", step, names(files), receipts, sc.approvals)
	}
}

// checkRecordedCert checks that the receipt last records the certificate
// in sc.cert.
func checkRecordedCert(t *testing.T, d keystore.OSDir, sc killScenario, step string, last keystore.Receipt) {
	t.Helper()
	ca, err := pki.ParseCertificate(readFile(t, d.Path(sc.cert)))
	if err != nil {
		t.Fatalf("killed at %s: %v", step, err)
	}
	if fp := pki.CertFingerprint(ca); last.CertificateFingerprint != fp {
		t.Errorf("killed at %s: the %s receipt records certificate %s, %s is %s", step, sc.op, last.CertificateFingerprint, sc.cert, fp)
	}
}

func names(es []fs.DirEntry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// copyTree copies dir into a new temporary directory.
func copyTree(t *testing.T, dir string) string {
	t.Helper()
	dst := t.TempDir()
	if out, err := exec.Command("cp", "-a", dir+"/.", dst).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	return dst
}

// rebase replaces the prefix from by to in every argument.
func rebase(args []string, from, to string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = strings.ReplaceAll(a, from, to)
	}
	return out
}
