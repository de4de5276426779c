package ceremony_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/steward-trustd/steward-trustd/internal/apidtest"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/internal/doctor"
	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// TestTrustStatement: only the root key chooses the workers' client CAs,
// end to end, on each backend as the
// root's signer: a self-signed ClientAuth CA written into accepted-cas.crt
// of a running daemon is not served (WARN with its fingerprint); `trust
// add` signed by the root serves it; `trust remove` takes it out; the
// older statement replayed with the CA is refused.
func TestTrustStatement(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { trustStatement(t, b) })
	}
}

func trustStatement(t *testing.T, b backend) {
	uri, env, initArgs, _ := b.setup(t)
	root := t.TempDir()
	dir := filepath.Join(root, "ceremony")
	rootURI := uri("os-ca")
	mustCeremony(t, env, append([]string{"init", "--signer", rootURI, "--cluster", "trust", "--out", dir}, initArgs...)...)
	d := startDaemon(t, dir, rootURI, append(env, "TRUSTD_RELOAD_INTERVAL=200ms")...)
	wc := workerConfig(t, filepath.Join(dir, certdir.FileWorkerPatch))
	caCrt := filepath.Join(dir, certdir.FileCACert)

	// The attack: a CA of our own, no key of the cluster needed.
	evilPath := filepath.Join(root, "evil.crt")
	evil, _ := devtest.SelfSignedCA(t, "evil")
	writeFile(t, evilPath, pki.EncodeCertificates(evil))
	writeFile(t, filepath.Join(dir, certdir.FileAcceptedCAs), pki.EncodeCertificates(evil))
	evilFP := pki.CertFingerprint(evil)
	waitFor(t, d, "a refusal naming the CA", func() bool { return strings.Contains(d.Logs(), evilFP) })
	wantServed(t, d.Addr, wc, 1, "after writing accepted-cas.crt")
	if !strings.Contains(d.Logs(), `"level":"WARN","msg":"reload refused: the root does not vouch`) {
		t.Errorf("no WARN for the unvouched CA:\n%s", d.Logs())
	}

	mustCeremony(t, env, "trust", "add", "--signer", rootURI, "--ca", caCrt, evilPath)
	old := readFile(t, filepath.Join(dir, certdir.FileTrustStatement))
	waitServed(t, d, wc, 2, "after trust add")
	if r := mustCeremony(t, env, "trust", "add", "--signer", rootURI, "--ca", caCrt, evilPath); !strings.Contains(r.stdout, "already completed") {
		t.Errorf("trust add re-run: %s", r)
	}
	mustCeremony(t, env, "trust", "remove", "--signer", rootURI, "--ca", caCrt, evilPath)
	waitServed(t, d, wc, 1, "after trust remove")

	// Replay: the CA and the statement that vouched for it, put back.
	writeFile(t, filepath.Join(dir, certdir.FileAcceptedCAs), pki.EncodeCertificates(evil))
	writeFile(t, filepath.Join(dir, certdir.FileTrustStatement), old)
	waitFor(t, d, "the replay refused", func() bool { return strings.Contains(d.Logs(), "a replayed statement") })
	wantServed(t, d.Addr, wc, 1, "after the replay")
}

// waitFor polls ok for up to 20 s (the daemon reloads every 200 ms).
func waitFor(t *testing.T, d *daemon, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("no %s within 20s:\n%s", what, d.Logs())
}

// waitServed waits until a worker's request returns n CAs in `ca`.
func waitServed(t *testing.T, d *daemon, wc *doctor.WorkerConfig, n int, when string) {
	t.Helper()
	waitFor(t, d, fmt.Sprintf("%s: a ca set of %d", when, n), func() bool { return served(t, d.Addr, wc) == n })
}

func wantServed(t *testing.T, addr string, wc *doctor.WorkerConfig, n int, when string) {
	t.Helper()
	if got := served(t, addr, wc); got != n {
		t.Errorf("%s: the worker got %d CAs in ca, want %d", when, got, n)
	}
}

// served is the number of CAs a worker gets in `ca`.
func served(t *testing.T, addr string, wc *doctor.WorkerConfig) int {
	t.Helper()
	resp, _, err := workerRequest(t, addr, wc)
	if err != nil {
		t.Fatalf("worker request: %v", err)
	}
	return len(resp.Bundle)
}

// TestFleetCheck runs `fleet check` against two apid-like servers
// configured from a real daemon response: one as the daemon answered
// (clean), one as a compromised trustd would answer (the same bundle plus
// a CA of its own). Exit 1, one line per node, only the poisoned one
// flagged, naming the extra CA.
func TestFleetCheck(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "ceremony")
	key := "file:" + filepath.Join(root, "os-ca.key")
	mustCeremony(t, nil, "init", "--signer", key, "--cluster", "fleet", "--out", dir)
	d := startDaemon(t, dir, key)
	bundle, serving := workerCertificate(t, d.Addr, workerConfig(t, filepath.Join(dir, certdir.FileWorkerPatch)))
	clean, err := apidtest.Start(serving, bundle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { clean.Close() })
	evil, _ := devtest.SelfSignedCA(t, "intruder")
	poisoned, err := apidtest.Start(serving, append(bundle, evil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { poisoned.Close() })
	nodes := filepath.Join(root, "nodes")
	writeFile(t, nodes, []byte(clean.Addr()+"\n"+poisoned.Addr()+"\n"))

	r := ceremony(t, nil, "fleet", "check", "--nodes", nodes, "--ca", filepath.Join(dir, certdir.FileCACert), "--timeout", "10s")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 1 || len(lines) != 2 || !strings.HasPrefix(lines[0], "OK") || !strings.HasPrefix(lines[1], "FLAGGED") || !strings.Contains(lines[1], "CN=intruder") {
		t.Fatalf("fleet check: %s", r)
	}
	if r := ceremony(t, nil, "fleet", "check", "--nodes", "10.0.0.0/8", "--ca", filepath.Join(dir, certdir.FileCACert)); r.code != 2 || !strings.Contains(r.stderr, "more than the limit") {
		t.Errorf("a /8: %s", r)
	}
}

// TestDaemonCoreLimit: no secret may reach a core dump, so the running
// daemon's core file size
// limit is 0, soft and hard, though it was started with cores allowed —
// so harden.AtStart ran in the real binary. (That the limit and
// PR_SET_DUMPABLE leave no core on a crash is internal/harden's
// TestCrashLeavesNoCore, against an unhardened control.)
func TestDaemonCoreLimit(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "ceremony")
	key := "file:" + filepath.Join(root, "os-ca.key")
	mustCeremony(t, nil, "init", "--signer", key, "--cluster", "core", "--out", dir)
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_CORE, &lim); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{Cur: lim.Max, Max: lim.Max}); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, dir, key)
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &lim); err != nil {
		t.Fatal(err)
	}
	limits := string(readFile(t, fmt.Sprintf("/proc/%d/limits", d.PID())))
	for _, line := range strings.Split(limits, "\n") {
		if strings.HasPrefix(line, "Max core file size") {
			if f := strings.Fields(line); len(f) < 6 || f[4] != "0" || f[5] != "0" {
				t.Errorf("daemon core limit: %q, want 0 0", line)
			}
			return
		}
	}
	t.Fatalf("no core limit in /proc/%d/limits:\n%s", d.PID(), limits)
}
