// Package softhsm makes throw-away SoftHSMv2 tokens for tests: a private
// softhsm2.conf and token directory, an initialised token, its PIN in a
// 0600 file, and pkcs11: key URIs for it. It drives softhsm2-util and does
// not need cgo, so daemon end-to-end tests can use it to provision a token
// for a subprocess.
//
// SoftHSM reads SOFTHSM2_CONF when the module is initialised: set it
// (Token.Env for a subprocess, NewTest's t.Setenv in process) before the
// module is loaded.
package softhsm

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/atomicfile"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
)

// ModuleCandidates returns the places libsofthsm2.so is looked for:
// Debian's and Ubuntu's package paths, then other common ones.
func ModuleCandidates() []string {
	return []string{
		"/usr/lib/softhsm/libsofthsm2.so",
		"/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
		"/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
		"/usr/lib64/pkcs11/libsofthsm2.so",
		"/usr/lib/pkcs11/libsofthsm2.so",
		"/usr/local/lib/softhsm/libsofthsm2.so",
	}
}

// ErrNotInstalled reports that SoftHSMv2 (module or softhsm2-util) is
// missing.
var ErrNotInstalled = errors.New("SoftHSMv2 is not installed (apt-get install softhsm2)")

// Default PINs of test tokens. They are test fixtures, not secrets.
const (
	DefaultSOPIN = "5432-so"
	DefaultPIN   = "1234-user"
)

// FindModule returns the path of libsofthsm2.so. SOFTHSM2_MODULE, if set,
// wins.
func FindModule() (string, error) {
	if p := os.Getenv("SOFTHSM2_MODULE"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("SOFTHSM2_MODULE: %w", err)
		}
		return p, nil
	}
	for _, p := range ModuleCandidates() {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: no libsofthsm2.so in %s", ErrNotInstalled, strings.Join(ModuleCandidates(), ", "))
}

// Available reports whether the module and softhsm2-util are installed.
func Available() error {
	if _, err := FindModule(); err != nil {
		return err
	}
	if _, err := exec.LookPath("softhsm2-util"); err != nil {
		return fmt.Errorf("%w: %w", ErrNotInstalled, err)
	}
	return nil
}

// Required reports whether missing devices must fail tests rather than
// skip them: CI=true or STEWARD_REQUIRE_DEVICES=1.
func Required() bool { return devtest.Required() }

// Token is an initialised SoftHSM token in its own configuration.
type Token struct {
	// Dir holds softhsm2.conf, the token directory and the PIN file.
	Dir string
	// ConfPath is the value for SOFTHSM2_CONF.
	ConfPath string
	// ModulePath is the libsofthsm2.so to put in module-path.
	ModulePath string
	// Label is the token label (the URI's token=).
	Label string
	// SOPIN and PIN are the security officer and user PINs.
	SOPIN, PIN string
	// PINFile holds PIN followed by a newline, mode 0600.
	PINFile string

	tokensDir string
	tokenDir  string // this token's subdirectory of tokensDir
}

// New creates dir/softhsm2.conf, dir/tokens and a token labelled label
// with the default PINs. dir must exist and should be empty.
func New(dir, label string) (*Token, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	mod, _ := FindModule()
	t := &Token{
		Dir:        dir,
		ConfPath:   filepath.Join(dir, "softhsm2.conf"),
		ModulePath: mod,
		Label:      label,
		SOPIN:      DefaultSOPIN,
		PIN:        DefaultPIN,
		PINFile:    filepath.Join(dir, "user.pin"),
		tokensDir:  filepath.Join(dir, "tokens"),
	}
	if err := os.Mkdir(t.tokensDir, 0o700); err != nil {
		return nil, fmt.Errorf("softhsm: %w", err)
	}
	conf := fmt.Sprintf("directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n", t.tokensDir)
	if err := atomicfile.Write(t.ConfPath, []byte(conf), 0o600, false); err != nil {
		return nil, fmt.Errorf("softhsm: write config: %w", err)
	}
	if err := atomicfile.Write(t.PINFile, []byte(t.PIN+"\n"), 0o600, false); err != nil {
		return nil, fmt.Errorf("softhsm: write PIN file: %w", err)
	}
	before, err := t.tokenDirs()
	if err != nil {
		return nil, err
	}
	if err := t.util("--init-token", "--free", "--label", label, "--so-pin", t.SOPIN, "--pin", t.PIN); err != nil {
		return nil, err
	}
	after, err := t.tokenDirs()
	if err != nil {
		return nil, err
	}
	for d := range after {
		if !before[d] {
			t.tokenDir = d
		}
	}
	if t.tokenDir == "" {
		return nil, errors.New("softhsm: softhsm2-util created no token directory")
	}
	return t, nil
}

// NewTest makes a token in t.TempDir() and sets SOFTHSM2_CONF with
// t.Setenv (so the test must not be parallel). Without SoftHSM it fails
// the test when Required(), and skips it otherwise.
func NewTest(t testing.TB, label string) *Token {
	t.Helper()
	if err := Available(); err != nil {
		if Required() {
			t.Fatalf("SoftHSMv2 is required (CI=true or STEWARD_REQUIRE_DEVICES=1): %v", err)
		}
		t.Skipf("skipping: %v (set STEWARD_REQUIRE_DEVICES=1 to make this a failure)", err)
	}
	tok, err := New(t.TempDir(), label)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("SOFTHSM2_CONF", tok.ConfPath)
	return tok
}

// Env returns the environment entry a subprocess needs to see the token.
func (t *Token) Env() string { return "SOFTHSM2_CONF=" + t.ConfPath }

// URI returns a pkcs11: key URI for the object labelled object and/or
// with id on this token, with module-path and pin-source set. extraQuery
// entries ("allow-extractable=true") are appended to the query verbatim.
func (t *Token) URI(object string, id []byte, extraQuery ...string) string {
	path := []string{"token=" + pct(t.Label)}
	if object != "" {
		path = append(path, "object="+pct(object))
	}
	if id != nil {
		var b strings.Builder
		for _, c := range id {
			fmt.Fprintf(&b, "%%%02X", c)
		}
		path = append(path, "id="+b.String())
	}
	q := append([]string{"module-path=" + pct(t.ModulePath), "pin-source=file:" + pct(t.PINFile)}, extraQuery...)
	return "pkcs11:" + strings.Join(path, ";") + "?" + strings.Join(q, "&")
}

// pct pct-encodes everything but RFC 3986 unreserved characters and '/'.
func pct(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~/", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// Remove moves the token's directory out of the token store, as if the
// token were unplugged. Restore puts it back.
func (t *Token) Remove() error {
	return os.Rename(filepath.Join(t.tokensDir, t.tokenDir), filepath.Join(t.Dir, "removed-"+t.tokenDir))
}

// Restore undoes Remove.
func (t *Token) Restore() error {
	return os.Rename(filepath.Join(t.Dir, "removed-"+t.tokenDir), filepath.Join(t.tokensDir, t.tokenDir))
}

// Reinit re-initialises the token with the same label and PINs, which
// destroys every object on it.
func (t *Token) Reinit() error {
	return t.util("--init-token", "--token", t.Label, "--label", t.Label, "--so-pin", t.SOPIN, "--pin", t.PIN)
}

// Delete deletes the token.
func (t *Token) Delete() error {
	return t.util("--delete-token", "--token", t.Label)
}

// Util runs softhsm2-util with args against this token's configuration
// and returns its combined output.
func (t *Token) Util(args ...string) (string, error) {
	cmd := exec.Command("softhsm2-util", args...)
	cmd.Env = append(os.Environ(), t.Env())
	out, err := cmd.CombinedOutput()
	if err != nil {
		// Output may echo arguments but softhsm2-util never prints PINs.
		return string(out), fmt.Errorf("softhsm2-util %s: %w: %s", args[0], err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func (t *Token) util(args ...string) error {
	_, err := t.Util(args...)
	return err
}

func (t *Token) tokenDirs() (map[string]bool, error) {
	ents, err := os.ReadDir(t.tokensDir)
	if err != nil {
		return nil, fmt.Errorf("softhsm: %w", err)
	}
	m := make(map[string]bool, len(ents))
	for _, e := range ents {
		if e.IsDir() {
			m[e.Name()] = true
		}
	}
	return m, nil
}
