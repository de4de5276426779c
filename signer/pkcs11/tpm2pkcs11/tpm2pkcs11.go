// Package tpm2pkcs11 makes throw-away tpm2-pkcs11 tokens for tests:
// Debian's libtpm2-pkcs11-1 on a swtpm, with its store in a temporary
// directory and the token added by tpm2_ptool (libtpm2-pkcs11-tools). It
// starts the processes it needs and does not need cgo.
//
// tpm2-pkcs11 needs a TPM resource manager, as it has on a real machine
// (/dev/tpmrm0): it leaves its transient objects loaded across
// C_Finalize, and tpm2_ptool runs one tpm2-tools process per step, so on
// a bare swtpm (three object slots) the second C_Initialize in a process
// already fails with "out of memory for object contexts", reported to
// the application as CKR_GENERAL_ERROR. The resource manager here is
// Debian's tpm2-abrmd on a private D-Bus session bus; the module reaches
// it with TPM2_PKCS11_TCTI=tabrmd:bus_type=session, and tpm2-abrmd
// reaches swtpm with its swtpm TCTI (TCP data and control ports).
package tpm2pkcs11

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/atomicfile"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11/testtoken"
)

// ModulePath is Debian's tpm2-pkcs11 module (amd64).
const ModulePath = "/usr/lib/x86_64-linux-gnu/pkcs11/libtpm2_pkcs11.so"

// PINs of test tokens: fixtures, not secrets.
const (
	DefaultSOPIN = "so-1234"
	DefaultPIN   = "user-1234"
)

// tools are the programs a token needs, and the Debian packages that
// ship them.
var tools = map[string]string{
	"swtpm":       "swtpm",
	"dbus-daemon": "dbus-daemon",
	"tpm2-abrmd":  "tpm2-abrmd",
	"tpm2_ptool":  "libtpm2-pkcs11-tools",
	"tpm2_getcap": "tpm2-tools",
}

// tabrmdTCTI is the TCTI library tpm2-abrmd's clients load.
const tabrmdTCTI = "/usr/lib/x86_64-linux-gnu/libtss2-tcti-tabrmd.so.0"

// Available reports whether a token can be made here.
func Available() error {
	for _, f := range []string{ModulePath, tabrmdTCTI} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("tpm2-pkcs11 is not installed (apt-get install libtpm2-pkcs11-1 libtss2-tcti-tabrmd0): %w", err)
		}
	}
	for tool, pkg := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is missing (apt-get install %s): %w", tool, pkg, err)
		}
	}
	return nil
}

// Token is a tpm2-pkcs11 token on its own swtpm, behind its own
// tpm2-abrmd.
type Token struct {
	// Fixture's Dir holds the TPM state, the tpm2-pkcs11 store, the bus
	// socket and the PIN file.
	testtoken.Fixture

	port  int // swtpm data port; the control port is port+1
	procs []*exec.Cmd
}

// New starts swtpm, a D-Bus session bus and tpm2-abrmd for dir (which
// must exist and be empty) and adds a token labelled label with
// tpm2_ptool. Close stops the processes.
func New(dir, label string) (*Token, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	t := &Token{Fixture: testtoken.Fixture{Dir: dir, ModulePath: ModulePath, Label: label, SOPIN: DefaultSOPIN, PIN: DefaultPIN,
		PINFile: filepath.Join(dir, "user.pin")}}
	if err := t.start(); err != nil {
		t.Close()
		return nil, err
	}
	if err := t.addToken(); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

func (t *Token) start() error {
	for _, d := range []string{"tpm", "store"} {
		if err := os.Mkdir(filepath.Join(t.Dir, d), 0o700); err != nil {
			return fmt.Errorf("tpm2pkcs11: %w", err)
		}
	}
	if err := atomicfile.Write(t.PINFile, []byte(t.PIN+"\n"), 0o600, false); err != nil {
		return fmt.Errorf("tpm2pkcs11: %w", err)
	}
	if err := t.startSwtpm(); err != nil {
		return err
	}
	if err := t.spawn("dbus-daemon", "--session", "--nofork", "--nopidfile", "--address=unix:path="+t.busPath()); err != nil {
		return err
	}
	if err := waitFor(func() error { _, err := os.Stat(t.busPath()); return err }); err != nil {
		return fmt.Errorf("tpm2pkcs11: dbus-daemon did not create its socket: %w", err)
	}
	return t.startResourceManager()
}

// startResourceManager starts tpm2-abrmd on swtpm and waits until it
// answers.
func (t *Token) startResourceManager() error {
	tcti := fmt.Sprintf("--tcti=swtpm:host=127.0.0.1,port=%d", t.port)
	if err := t.spawn("tpm2-abrmd", "--session", "--allow-root", "--flush-all", tcti); err != nil {
		return err
	}
	if err := waitFor(func() error { _, err := t.Run("tpm2_getcap", "handles-transient"); return err }); err != nil {
		return fmt.Errorf("tpm2pkcs11: tpm2-abrmd does not answer: %w", err)
	}
	return nil
}

// StopResourceManager stops tpm2-abrmd, as a crash or a service restart
// would: every client loses its connection, sessions and objects.
// StartResourceManager starts it again.
func (t *Token) StopResourceManager() {
	n := len(t.procs) - 1
	stop(t.procs[n])
	t.procs = t.procs[:n]
}

// StartResourceManager undoes StopResourceManager.
func (t *Token) StartResourceManager() error { return t.startResourceManager() }

// startSwtpm starts swtpm on a free pair of loopback ports (the swtpm
// TCTI wants the control port right after the data port), trying a few
// pairs since another process may take a port between probe and bind.
func (t *Token) startSwtpm() error {
	var err error
	for range 5 {
		if t.port, err = freePortPair(); err != nil {
			continue
		}
		err = t.spawn("swtpm", "socket", "--tpm2", "--tpmstate", "dir="+filepath.Join(t.Dir, "tpm"),
			"--server", fmt.Sprintf("type=tcp,port=%d,bindaddr=127.0.0.1", t.port),
			"--ctrl", fmt.Sprintf("type=tcp,port=%d,bindaddr=127.0.0.1", t.port+1),
			"--flags", "not-need-init,startup-clear")
		if err != nil {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(t.port))
		if err = waitFor(func() error { return dialClose(addr) }); err == nil {
			return nil
		}
	}
	return fmt.Errorf("tpm2pkcs11: start swtpm: %w", err)
}

func dialClose(addr string) error {
	c, err := net.Dial("tcp", addr)
	if err == nil {
		c.Close()
	}
	return err
}

// freePortPair returns a port p such that p and p+1 were both free.
func freePortPair() (int, error) {
	a, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer a.Close()
	p := a.Addr().(*net.TCPAddr).Port
	b, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+1)))
	if err != nil {
		return 0, err
	}
	b.Close()
	return p, nil
}

// addToken creates the store's primary key and the token (tpm2_ptool).
func (t *Token) addToken() error {
	if _, err := t.Run("tpm2_ptool", "init", "--path", t.storePath()); err != nil {
		return err
	}
	_, err := t.Run("tpm2_ptool", "addtoken", "--pid=1", "--label="+t.Label, "--sopin="+t.SOPIN, "--userpin="+t.PIN, "--path", t.storePath())
	return err
}

func (t *Token) busPath() string   { return filepath.Join(t.Dir, "bus") }
func (t *Token) storePath() string { return filepath.Join(t.Dir, "store") }

// Env returns the environment entries a process needs to use the token
// through the module or tpm2-tools.
func (t *Token) Env() []string {
	const tcti = "tabrmd:bus_type=session"
	return []string{
		"DBUS_SESSION_BUS_ADDRESS=unix:path=" + t.busPath(),
		"TPM2_PKCS11_TCTI=" + tcti,
		"TPM2TOOLS_TCTI=" + tcti,
		"TPM2_PKCS11_STORE=" + t.storePath(),
	}
}

// Run runs a tool with the token's environment and returns its combined
// output. Errors carry the output but never the arguments (PINs).
func (t *Token) Run(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), t.Env()...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("tpm2pkcs11: %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// spawn starts a long-running helper that dies with the test process.
func (t *Token) spawn(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), t.Env()...)
	cmd.Dir = t.Dir
	log, err := os.Create(filepath.Join(t.Dir, name+".log"))
	if err != nil {
		return fmt.Errorf("tpm2pkcs11: %w", err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("tpm2pkcs11: start %s: %w", name, err)
	}
	t.procs = append(t.procs, cmd)
	return nil
}

// Close stops tpm2-abrmd, the bus and swtpm, newest first.
func (t *Token) Close() error {
	for i := len(t.procs) - 1; i >= 0; i-- {
		stop(t.procs[i])
	}
	t.procs = nil
	return nil
}

// stop sends p SIGTERM, and SIGKILL if it is still there 5 s later.
func stop(p *exec.Cmd) {
	_ = p.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.Process.Kill()
		<-done
	}
}

// waitFor polls ready every 50 ms for up to 15 s.
func waitFor(ready func() error) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := ready()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// NewTest makes a token in a temporary directory and stops its processes
// at the end of the test. Without the tools it fails the test when
// devtest.Required(), and skips it otherwise.
func NewTest(tb testing.TB, label string) *Token {
	tb.Helper()
	devtest.NeedAvailable(tb, "tpm2-pkcs11", Available())
	// Not tb.TempDir(): the bus socket's path must stay under the 108
	// bytes of a unix socket address, whatever the test's name.
	dir, err := os.MkdirTemp("", "tpm2p11")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	tok, err := New(dir, label)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tok.Close() })
	return tok
}
