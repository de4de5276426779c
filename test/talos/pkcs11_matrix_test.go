package talos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11/opencryptoki"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11/softhsm"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11/tpm2pkcs11"
)

// hsm is one PKCS#11 module of the conformance matrix with a fresh token
// labelled matrixToken.
type hsm struct {
	module  string
	pin     string // the user PIN: a test fixture
	pinFile string
	// algorithm is the ceremony's --algorithm: the module's best.
	algorithm string
	// command runs a program against the token (environment, and for
	// opencryptoki its own pkcsslotd); daemonBin is the daemon for
	// devtest.StartDaemon, env its environment.
	command   func(name string, args ...string) *exec.Cmd
	daemonBin string
	env       []string
	// fault takes the token away under the running daemon and returns
	// what brings it back; nil where the module has no such fault.
	fault func(t *testing.T) (restore func() error)
}

const matrixToken = "trustd"

func softhsmHSM(t *testing.T) hsm {
	devtest.NeedTool(t, "softhsm2-util")
	tok, err := softhsm.New(t.TempDir(), matrixToken)
	if err != nil {
		t.Fatal(err)
	}
	return hsm{module: tok.ModulePath, pin: tok.PIN, pinFile: tok.PINFile, algorithm: "p256",
		command: envCommand([]string{tok.Env()}), daemonBin: filepath.Join(binDir, "steward-trustd"), env: []string{tok.Env()},
		fault: func(t *testing.T) func() error {
			if err := tok.Remove(); err != nil {
				t.Fatal(err)
			}
			return tok.Restore
		}}
}

// opencryptokiHSM: Debian 12's opencryptoki 3.8 soft token cannot
// generate EC keys (CKR_MECHANISM_INVALID, see TestOpencryptokiNoEC), so
// its CA key is RSA-3072.
func opencryptokiHSM(t *testing.T) hsm {
	tok := opencryptoki.NewTest(t, matrixToken)
	bin, err := tok.Wrap(t.TempDir(), "steward-trustd", filepath.Join(binDir, "steward-trustd"))
	if err != nil {
		t.Fatal(err)
	}
	return hsm{module: tok.ModulePath, pin: tok.PIN, pinFile: tok.PINFile, algorithm: "rsa3072",
		command: tok.Command, daemonBin: bin}
}

func tpm2HSM(t *testing.T) hsm {
	tok := tpm2pkcs11.NewTest(t, matrixToken)
	return hsm{module: tok.ModulePath, pin: tok.PIN, pinFile: tok.PINFile, algorithm: "p256",
		command: envCommand(tok.Env()), daemonBin: filepath.Join(binDir, "steward-trustd"), env: tok.Env(),
		fault: func(*testing.T) func() error {
			tok.StopResourceManager()
			return tok.StartResourceManager
		}}
}

func envCommand(env []string) func(string, ...string) *exec.Cmd {
	return func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), env...)
		return cmd
	}
}

// run runs a program against the token and fails the test on error.
func (h hsm) run(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	out, err := h.try(env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), args[0], err, out)
	}
	return out
}

func (h hsm) try(env []string, name string, args ...string) (string, error) {
	cmd := h.command(name, args...)
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (h hsm) ceremony(t *testing.T, args ...string) string {
	t.Helper()
	return h.run(t, nil, filepath.Join(binDir, "steward-trustd-ceremony"), args...)
}

// p11tool runs GnuTLS's p11tool (not ours) on the module, logged in.
func (h hsm) p11tool(t *testing.T, args ...string) string {
	t.Helper()
	return h.run(t, []string{"GNUTLS_PIN=" + h.pin}, "p11tool", append([]string{"--provider", h.module}, args...)...)
}

// query is the URI query every key URI of the matrix carries.
func (h hsm) query() string {
	return "?module-path=" + h.module + "&pin-source=file:" + h.pinFile
}

var p11toolURL = regexp.MustCompile(`(?m)^\s*URL: (pkcs11:\S+)$`)

// tokenURL returns the token's URL exactly as p11tool --list-tokens
// prints it (tpm2-pkcs11's model is NUL-padded: %00 in the URL).
func (h hsm) tokenURL(t *testing.T) string {
	t.Helper()
	out := h.p11tool(t, "--list-tokens")
	for _, m := range p11toolURL.FindAllStringSubmatch(out, -1) {
		if strings.HasSuffix(m[1], ";token="+matrixToken) {
			return m[1]
		}
	}
	t.Fatalf("p11tool lists no token %q:\n%s", matrixToken, out)
	return ""
}

// TestPKCS11Matrix runs one suite on SoftHSMv2, opencryptoki's soft token
// and tpm2-pkcs11 on swtpm (behind tpm2-abrmd), each from Debian's
// packages: the ceremony's init through a token URI copied verbatim from
// p11tool, status, the key's attributes as p11tool (GnuTLS) reads them,
// the daemon opened with the private key URI p11tool prints and serving
// Talos's own worker code, a daemon restart, and a re-run of init that
// resumes instead of making a second key.
func TestPKCS11Matrix(t *testing.T) {
	devtest.NeedTool(t, "p11tool")
	for _, m := range []struct {
		name string
		hsm  func(*testing.T) hsm
	}{
		{"softhsm2", softhsmHSM},
		{"opencryptoki", opencryptokiHSM},
		{"tpm2-pkcs11", tpm2HSM},
	} {
		t.Run(m.name, func(t *testing.T) {
			start := time.Now()
			matrixSuite(t, m.hsm(t))
			t.Logf("%s: %v", m.name, time.Since(start).Round(time.Millisecond))
		})
	}
}

func matrixSuite(t *testing.T, h hsm) {
	out := filepath.Join(t.TempDir(), "ceremony")
	initURI := h.tokenURL(t) + ";object=os-ca;id=%01" + h.query()
	h.ceremony(t, "init", "--signer", initURI, "--algorithm", h.algorithm, "--cluster", "e2e", "--out", out)
	ca := filepath.Join(out, certdir.FileCACert)
	if st := h.ceremony(t, "status", "--signer", initURI, "--ca", ca); !strings.Contains(st, "pkcs11") {
		t.Fatalf("status does not describe the pkcs11 key:\n%s", st)
	}
	checkMismatchNamed(t, h, initURI)
	keyURI := checkKeyAttributes(t, h) + h.query()
	d := startMatrixDaemon(t, h, out, keyURI)
	t.Run("talos worker", d.talosWorkers)
	d.Stop(t)
	d = startMatrixDaemon(t, h, out, keyURI)
	t.Run("restart", d.talosWorkers)
	if h.fault != nil {
		t.Run("recovery", func(t *testing.T) { d.lostAndBack(t, h.fault(t)) })
	}
	resumed := h.ceremony(t, "init", "--signer", initURI, "--algorithm", h.algorithm, "--cluster", "e2e", "--out", out)
	if !strings.Contains(resumed, "earlier run") {
		t.Fatalf("a second init did not resume the first run's key:\n%s", resumed)
	}
	if n := len(p11toolURL.FindAllString(h.p11tool(t, "--login", "--list-privkeys", h.tokenURL(t)), -1)); n != 1 {
		t.Fatalf("%d private keys on the token after a re-run, want 1", n)
	}
}

// checkKeyAttributes reads the key as GnuTLS's p11tool sees it: sensitive,
// never extractable, not extractable, and its value cannot be exported.
// It returns the private key's URL as p11tool prints it.
func checkKeyAttributes(t *testing.T, h hsm) string {
	t.Helper()
	list := h.p11tool(t, "--login", "--list-privkeys", h.tokenURL(t))
	urls := p11toolURL.FindAllStringSubmatch(list, -1)
	if len(urls) != 1 || !strings.Contains(urls[0][1], "type=private") {
		t.Fatalf("want one private key:\n%s", list)
	}
	flags := regexp.MustCompile(`(?m)^\s*Flags: (.*)$`).FindStringSubmatch(list)
	if flags == nil || !strings.Contains(flags[1], "CKA_SENSITIVE") || !strings.Contains(flags[1], "CKA_NEVER_EXTRACTABLE") ||
		strings.Contains(strings.ReplaceAll(flags[1], "CKA_NEVER_EXTRACTABLE", ""), "CKA_EXTRACTABLE") {
		t.Fatalf("key flags: want CKA_SENSITIVE and CKA_NEVER_EXTRACTABLE, not CKA_EXTRACTABLE:\n%s", list)
	}
	if exported, err := h.try([]string{"GNUTLS_PIN=" + h.pin}, "p11tool", "--provider", h.module, "--login", "--export", urls[0][1]); err == nil {
		t.Fatalf("p11tool exported the private key:\n%s", exported)
	}
	return urls[0][1]
}

// startMatrixDaemon starts the daemon on the ceremony directory out with
// the key at uri and checks that it opened the key as non-extractable
// and never logged the PIN.
func startMatrixDaemon(t *testing.T, h hsm, out, uri string) *deviceDaemon {
	t.Helper()
	health := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	d := devtest.StartDaemon(t, h.daemonBin, append([]string{
		"TRUSTD_CERT_DIR=" + out,
		"TRUSTD_SIGNER=" + uri,
		"TRUSTD_HEALTH_ADDR=" + health,
		"TRUSTD_READY_WINDOW=2s",
		"TRUSTD_PEER_RATE=-1",
	}, h.env...)...)
	if !strings.Contains(d.Logs(), `"backend":"pkcs11"`) || !strings.Contains(d.Logs(), `"extractable":false`) {
		t.Fatalf("daemon did not open the key as non-extractable\n%s", d.Logs())
	}
	if strings.Contains(d.Logs(), h.pin) {
		t.Fatal("PIN in the daemon's log")
	}
	return &deviceDaemon{
		daemon: d,
		token:  strings.TrimSpace(string(readFile(t, filepath.Join(out, certdir.FileToken)))),
		caPEM:  readFile(t, filepath.Join(out, certdir.FileCACert)),
		health: "http://" + health,
	}
}

var serialAttr = regexp.MustCompile(`serial=[^;?]*`)

// checkMismatchNamed: a URI whose serial does not match says so, with the
// URI's and the token's values, instead of naming only token=.
func checkMismatchNamed(t *testing.T, h hsm, uri string) {
	t.Helper()
	wrong := serialAttr.ReplaceAllString(uri, "serial=no-such-serial")
	out, err := h.try(nil, filepath.Join(binDir, "steward-trustd-ceremony"), "status", "--signer", wrong)
	if err == nil || !strings.Contains(out, `serial: URI says "no-such-serial", found "`) {
		t.Fatalf("status with a wrong serial: %v, want an error naming the serial with both values\n%s", err, out)
	}
}

// TestOpencryptokiNoEC: Debian 12's opencryptoki soft token cannot make
// EC keys; init says which mechanism the module rejected, leaves no
// record of a key behind, and the same directory then works with RSA.
func TestOpencryptokiNoEC(t *testing.T) {
	h := opencryptokiHSM(t)
	out := filepath.Join(t.TempDir(), "ceremony")
	uri := "pkcs11:token=" + matrixToken + ";object=os-ca" + h.query()
	msg, err := h.try(nil, filepath.Join(binDir, "steward-trustd-ceremony"), "init", "--signer", uri, "--algorithm", "p256", "--cluster", "e2e", "--out", out)
	if err == nil || !strings.Contains(msg, "CKR_MECHANISM_INVALID") || !strings.Contains(msg, "cannot generate p256") {
		t.Fatalf("init p256 on opencryptoki: %v, want the rejected mechanism named\n%s", err, msg)
	}
	if intents, _ := filepath.Glob(filepath.Join(out, certdir.DirReceipts, "*.intent")); len(intents) > 0 {
		t.Fatalf("intent records left behind: %v", intents)
	}
	h.ceremony(t, "init", "--signer", uri, "--algorithm", "rsa3072", "--cluster", "e2e", "--out", out)
}

// lostAndBack: with the token taken away, d answers Unavailable and turns
// not ready; after restore it issues again and turns ready, without a
// restart.
func (d *deviceDaemon) lostAndBack(t *testing.T, restore func() error) {
	c := d.client(t)
	restored := false
	defer func() {
		if !restored {
			_ = restore()
		}
	}()
	eventually(t, 20*time.Second, "Unavailable with the token gone", func() bool { return d.request(c) == codes.Unavailable })
	eventually(t, 10*time.Second, "readyz 503 with the token gone", func() bool { return get(d.health+"/readyz") == 503 })
	restored = true
	if err := restore(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.Logs())
		}
	}()
	eventually(t, 30*time.Second, "issuance after the token returned", func() bool { return d.request(c) == codes.OK })
	eventually(t, 10*time.Second, "readyz 200 after the token returned", func() bool { return get(d.health+"/readyz") == 200 })
}
