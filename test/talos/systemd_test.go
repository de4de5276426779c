package talos

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// unitPath is the shipped unit; the test reads it, never a copy.
var unitPath = filepath.Join("..", "..", "deploy", "systemd", "steward-trustd.service")

// serviceUID is the unit's User= here: an id no account uses.
const serviceUID = 61873

// unitDirectives says how the test treats each [Service] directive of the
// unit, so that a directive added to the unit must be classified here.
var unitDirectives = map[string]string{
	"Type": "n/a", "Restart": "n/a", "RestartSec": "n/a", "TimeoutStopSec": "n/a", "LimitNOFILE": "n/a",
	"User": "run as an unprivileged uid", "Group": "its gid", "SupplementaryGroups": "setgroups",
	"Environment": "passed", "EnvironmentFile": "passed, overriding Environment", "ExecStart": "run",
	"ProtectSystem": "strict: every host directory read-only", "ProtectHome": "tmpfs", "PrivateTmp": "tmpfs",
	"ReadOnlyPaths": "read-only bind", "UMask": "umask", "NoNewPrivileges": "bwrap sets no_new_privs",
	"CapabilityBoundingSet": "unprivileged: no capabilities", "AmbientCapabilities": "none",
	"RestrictAddressFamilies": "seccomp", "SystemCallFilter": "seccomp", "SystemCallArchitectures": "seccomp",
	"ProtectHostname": "UTS namespace", "ProtectProc": "own PID namespace", "ProcSubset": "own PID namespace",
	"RestrictNamespaces": "not emulated (bwrap needs namespaces to build the sandbox)",
	"DevicePolicy":       "minimal /dev (no TPM device here: swtpm over TCP)", "DeviceAllow": "see DevicePolicy", "PrivateDevices": "minimal /dev",
	"ProtectKernelTunables": "unprivileged", "ProtectKernelModules": "unprivileged", "ProtectKernelLogs": "unprivileged",
	"ProtectControlGroups": "unprivileged", "ProtectClock": "unprivileged", "RestrictRealtime": "not emulated",
	"RestrictSUIDSGID": "not emulated", "LockPersonality": "not emulated", "MemoryDenyWriteExecute": "not emulated",
	"RemoveIPC": "own IPC namespace",
}

// TestSystemdUnit follows the install recipe in the unit's header, then
// runs the unit's ExecStart as its User/Group/SupplementaryGroups with its
// Environment and EnvironmentFile, under its file-system layout
// (ProtectSystem=strict, ProtectHome, PrivateTmp, ReadOnlyPaths) via
// bubblewrap and its RestrictAddressFamilies, SystemCallFilter and
// SystemCallArchitectures as a seccomp program, all read from the shipped
// unit. The daemon cannot list interfaces there (netlink is forbidden),
// so it must fall back to the hostname + TRUSTD_CERT_SANS and serve: a
// Talos worker gets a certificate. This machine has no /dev/tpmrm0 and no
// systemd as PID 1: the key is in swtpm (over TCP, through
// /etc/default/steward-trustd), and the directives marked "not emulated"
// above are not.
func TestSystemdUnit(t *testing.T) {
	bwrap := devtest.NeedTool(t, "bwrap")
	devtest.NeedTool(t, "systemd-analyze")
	if os.Geteuid() != 0 {
		if devtest.Required() {
			t.Fatal("the systemd unit test switches to the unit's unprivileged user, which needs root (CI runs as root)")
		}
		t.Skip("the systemd unit test needs root to switch to the unit's user")
	}
	verifyUnit(t)
	u := parseUnit(t, unitPath)
	for k := range u {
		if d, ok := strings.CutPrefix(k, "Service."); ok && unitDirectives[d] == "" {
			t.Fatalf("unit directive %s: classify it in unitDirectives (emulated how, or why not)", d)
		}
	}
	creds := serviceCreds(t, u)
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{TCP: true})
	m := installPerRecipe(t, u, creds, sw)
	d := runUnit(t, bwrap, u, creds, m)
	if !strings.Contains(d.logs.String(), "cannot list network interfaces") || !strings.Contains(d.logs.String(), "TRUSTD_CERT_SANS") {
		t.Fatalf("want the one warning that interfaces cannot be listed (netlink forbidden) naming TRUSTD_CERT_SANS\n%s", d.logs.String())
	}
	ca, crt, id, err := workerRequest(t, d.addr, m.token, m.caPEM, csrFromCA, 30*time.Second)
	if err != nil {
		t.Fatalf("Talos worker against the unit: %v\n%s", err, d.logs.String())
	}
	checkIssued(t, ca, crt, id, [][]byte{m.caPEM})
}

// serviceCreds are User=, Group= and SupplementaryGroups= as ids here:
// the unit's user does not exist on this machine, so it is serviceUID;
// supplementary groups must exist (tss comes with swtpm).
func serviceCreds(t *testing.T, u unitFile) *syscall.Credential {
	t.Helper()
	if _, err := user.LookupId(strconv.Itoa(serviceUID)); err == nil {
		t.Fatalf("uid %d is in use here; pick another serviceUID", serviceUID)
	}
	c := &syscall.Credential{Uid: serviceUID, Gid: serviceUID}
	for _, v := range u["Service.SupplementaryGroups"] {
		for _, name := range words(v) {
			g, err := user.LookupGroup(name)
			if err != nil {
				t.Fatalf("SupplementaryGroups=%s: %v", name, err)
			}
			gid, _ := strconv.Atoi(g.Gid)
			c.Groups = append(c.Groups, uint32(gid))
		}
	}
	return c
}

// machine is the host side of the sandbox: directories standing in for
// the unit's paths, the environment file, what the worker needs.
type machine struct {
	etcDir  string // /etc/steward-trustd
	binDir  string // /usr/local/bin
	envFile string // /etc/default/steward-trustd
	token   string
	caPEM   []byte
}

// installPerRecipe runs the recipe's install -d, chgrp and chmod lines
// literally (paths under /etc/steward-trustd moved to a temporary
// directory, the group name replaced by its id) around the ceremony, and
// writes /etc/default/steward-trustd as the recipe says.
func installPerRecipe(t *testing.T, u unitFile, creds *syscall.Credential, sw *tpmsim.Swtpm) *machine {
	t.Helper()
	root, err := os.MkdirTemp("", "systemd-unit-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	must(t, os.Chmod(root, 0o755))
	m := &machine{etcDir: filepath.Join(root, "etc-steward-trustd"), binDir: filepath.Join(root, "bin"), envFile: filepath.Join(root, "default")}
	must(t, os.Mkdir(m.binDir, 0o755))
	for _, b := range []string{"steward-trustd", "steward-trustd-ceremony"} {
		copyFile(t, filepath.Join(binDir, b), filepath.Join(m.binDir, b), 0o755)
	}
	recipe := recipeLines(t)
	run := func(prefix string) {
		for _, l := range recipe {
			if strings.HasPrefix(l, prefix) {
				runRecipeLine(t, l, m.etcDir, creds.Gid)
			}
		}
	}
	run("install -d ")
	signer := u.environment(t, nil)["TRUSTD_SIGNER"]
	hostSigner := strings.Replace(strings.Replace(signer, "/etc/steward-trustd", m.etcDir, 1), "device=/dev/tpmrm0", sw.URIAttrs(), 1)
	ceremony(t, nil, "init", "--signer", hostSigner, "--cluster", "e2e", "--out", filepath.Join(m.etcDir, "certs"))
	run("chgrp ")
	run("chmod ")
	m.token = strings.TrimSpace(string(readFile(t, filepath.Join(m.etcDir, "certs", "token"))))
	m.caPEM = readFile(t, filepath.Join(m.etcDir, "certs", "os-ca.crt"))
	env := fmt.Sprintf("TRUSTD_CERT_SANS=127.0.0.1\n"+
		"# This machine: swtpm over TCP instead of /dev/tpmrm0, free loopback ports.\n"+
		"TRUSTD_SIGNER=%s\nTRUSTD_LISTEN_ADDRESS=127.0.0.1\nTRUSTD_PORT=%d\nTRUSTD_HEALTH_ADDR=127.0.0.1:%d\n",
		strings.Replace(signer, "device=/dev/tpmrm0", sw.URIAttrs(), 1), freePort(t), freePort(t))
	must(t, os.WriteFile(m.envFile, []byte(env), 0o644))
	return m
}

// recipeLines are the commands of the unit header's "Install" recipe.
func recipeLines(t *testing.T) []string {
	t.Helper()
	b := readFile(t, unitPath)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if c, ok := strings.CutPrefix(l, "#   "); ok && !strings.HasPrefix(c, " ") {
			out = append(out, strings.TrimSpace(c))
		}
	}
	for _, want := range []string{"install -d ", "chgrp ", "chmod "} {
		found := false
		for _, l := range out {
			found = found || strings.HasPrefix(l, want)
		}
		if !found {
			t.Fatalf("the unit's recipe has no %q line", want)
		}
	}
	return out
}

func runRecipeLine(t *testing.T, line, etcDir string, gid uint32) {
	t.Helper()
	if strings.Contains(line, "...") {
		t.Fatalf("recipe line is not literal: %q", line)
	}
	args := words(strings.ReplaceAll(line, "/etc/steward-trustd", etcDir))
	for i, a := range args {
		if a == "steward-trustd" { // the group
			args[i] = strconv.Itoa(int(gid))
		}
	}
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("recipe %q: %v\n%s", line, err, out)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// sandboxed is the unit's process.
type sandboxed struct {
	addr string
	logs *devtest.LockedBuffer
}

// runUnit starts ExecStart in the sandbox and waits until it listens.
func runUnit(t *testing.T, bwrap string, u unitFile, creds *syscall.Credential, m *machine) *sandboxed {
	t.Helper()
	env := u.environment(t, map[string]string{"/etc/default/steward-trustd": m.envFile})
	argv := execStart(t, u)
	args := append(sandboxArgs(t, u, m), "--clearenv", "--setenv", "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	for k, v := range env {
		args = append(args, "--setenv", k, v)
	}
	args = append(append(args, "--seccomp", "3", "--"), argv...)
	umask := u.one(t, "Service.UMask")
	cmd := exec.Command("/bin/sh", append([]string{"-c", `umask "$0" && exec "$@"`, umask, bwrap}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: creds, Pdeathsig: syscall.SIGKILL}
	cmd.ExtraFiles = []*os.File{seccompFile(t, u)}
	return startSandboxed(t, cmd, "127.0.0.1:"+env["TRUSTD_PORT"])
}

// execStart is ExecStart's command line (systemd prefixes refused: the
// unit must run the daemon plainly).
func execStart(t *testing.T, u unitFile) []string {
	t.Helper()
	argv := words(u.one(t, "Service.ExecStart"))
	if len(argv) == 0 || !filepath.IsAbs(argv[0]) || filepath.Dir(argv[0]) != "/usr/local/bin" {
		t.Fatalf("ExecStart %q: want /usr/local/bin/... as the recipe installs it", argv)
	}
	return argv
}

// sandboxArgs lays out the file system as the unit's directives make it.
func sandboxArgs(t *testing.T, u unitFile, m *machine) []string {
	t.Helper()
	if u.one(t, "Service.ProtectSystem") != "strict" || u.one(t, "Service.PrivateTmp") != "yes" || u.one(t, "Service.ProtectHome") != "yes" {
		t.Fatal("the sandbox emulates ProtectSystem=strict, PrivateTmp=yes, ProtectHome=yes; the unit says otherwise")
	}
	args := []string{"--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--proc", "/proc", "--dev", "/dev"}
	args = append(args, readOnlyTree(t, "/", map[string]bool{"proc": true, "dev": true, "etc": true, "tmp": true})...)
	args = append(args, readOnlyTree(t, "/etc", nil)...)
	args = append(args, "--tmpfs", "/tmp", "--tmpfs", "/var/tmp")
	for _, p := range []string{"/home", "/root", "/run/user"} {
		if _, err := os.Stat(p); err == nil {
			args = append(args, "--tmpfs", p)
		}
	}
	args = append(args, "--ro-bind", m.binDir, "/usr/local/bin")
	for _, p := range words(u.one(t, "Service.ReadOnlyPaths")) {
		if p != "/etc/steward-trustd" {
			t.Fatalf("ReadOnlyPaths %s: the test knows only /etc/steward-trustd", p)
		}
		args = append(args, "--ro-bind", m.etcDir, p)
	}
	return args
}

// readOnlyTree binds every entry of dir read-only (symlinks as symlinks),
// leaving out skip: ProtectSystem=strict with room for the unit's own
// mounts, which a read-only bind of dir itself would not leave.
func readOnlyTree(t *testing.T, dir string, skip map[string]bool) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--dir", dir}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		switch {
		case skip[e.Name()]:
		case e.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				t.Fatal(err)
			}
			args = append(args, "--symlink", target, p)
		case e.IsDir() || e.Type().IsRegular():
			args = append(args, "--ro-bind-try", p, p)
		}
	}
	return args
}

// seccompFile holds the unit's seccomp program for bwrap --seccomp 3.
func seccompFile(t *testing.T, u unitFile) *os.File {
	t.Helper()
	if u.one(t, "Service.SystemCallArchitectures") != "native" {
		t.Fatal("the filter emulates SystemCallArchitectures=native only")
	}
	prog := seccompFilter(t, words(u.one(t, "Service.RestrictAddressFamilies")), syscallFilter(t, u["Service.SystemCallFilter"]), unix.SYS_SOCKET)
	f, err := os.CreateTemp("", "seccomp-")
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(f.Name())
	t.Cleanup(func() { f.Close() })
	if _, err := f.Write(prog); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	return f
}

// startSandboxed starts cmd and waits for the daemon's listening line.
func startSandboxed(t *testing.T, cmd *exec.Cmd, addr string) *sandboxed {
	t.Helper()
	s := &sandboxed{addr: addr, logs: &devtest.LockedBuffer{}}
	pr, pw := io.Pipe()
	cmd.Stdout = s.logs
	cmd.Stderr = io.MultiWriter(s.logs, pw)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); pw.Close() }()
	t.Cleanup(func() { stopSandboxed(t, cmd.Process.Pid, done, s.logs) })
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "steward-trustd listening") {
				close(listening)
				break
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	select {
	case <-listening:
		return s
	case err := <-done:
		done <- err
		t.Fatalf("the unit's command exited: %v\n%s", err, s.logs.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("the unit's command did not listen within 60s\n%s", s.logs.String())
	}
	return nil
}

// stopSandboxed stops the unit as systemd does, with SIGTERM to the main
// process (the daemon inside bwrap, which does not forward signals), and
// expects a clean exit; SIGKILL after 20 s.
func stopSandboxed(t *testing.T, bwrapPid int, done chan error, logs *devtest.LockedBuffer) {
	pid := descendant(bwrapPid, "steward-trustd")
	if pid == 0 {
		_ = syscall.Kill(bwrapPid, syscall.SIGKILL)
		<-done
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the unit's command exited with %v after SIGTERM\n%s", err, logs.String())
		}
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(bwrapPid, syscall.SIGKILL)
		<-done
		t.Errorf("the unit's command did not stop within 20s of SIGTERM")
	}
}

// descendant finds the process named comm below pid (via /proc).
func descendant(pid int, comm string) int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	parent := map[int]int{}
	names := map[int]string{}
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		open, closing := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
		if open < 0 || closing < open {
			continue
		}
		p, _ := strconv.Atoi(strings.TrimSpace(string(b[:open])))
		f := strings.Fields(string(b[closing+1:]))
		if len(f) < 2 {
			continue
		}
		parent[p], _ = strconv.Atoi(f[1])
		names[p] = string(b[open+1 : closing])
	}
	for p, n := range names {
		if n != comm {
			continue
		}
		for a := parent[p]; a > 1; a = parent[a] {
			if a == pid {
				return p
			}
		}
	}
	return 0
}

// verifyUnit runs `systemd-analyze verify` on the shipped unit installed
// in a scratch root (with the daemon at ExecStart's path and the host's
// system units for its dependencies); any complaint (unknown directive,
// bad value, missing executable) fails the test.
func verifyUnit(t *testing.T) {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"usr/local/bin", "etc/systemd/system", "usr/lib/systemd"} {
		must(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	copyFile(t, filepath.Join(binDir, "steward-trustd"), filepath.Join(root, "usr/local/bin/steward-trustd"), 0o755)
	copyFile(t, unitPath, filepath.Join(root, "etc/systemd/system/steward-trustd.service"), 0o644)
	if out, err := exec.Command("cp", "-r", "/usr/lib/systemd/system", filepath.Join(root, "usr/lib/systemd/")).CombinedOutput(); err != nil {
		t.Fatalf("copy the host's system units: %v\n%s", err, out)
	}
	out, err := exec.Command("systemd-analyze", "verify", "--root="+root, "/etc/systemd/system/steward-trustd.service").CombinedOutput()
	if err != nil || len(out) != 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
