package tpm2pkcs11

import (
	"strings"
	"testing"
)

// TestNew: the token tpm2_ptool added is listed by p11tool (GnuTLS, not
// ours) through the module, initialised and requiring login.
func TestNew(t *testing.T) {
	tok := NewTest(t, "matrix")
	out, err := tok.Run("p11tool", "--provider", tok.ModulePath, "--list-tokens")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "Label: matrix") || !strings.Contains(out, "Requires login") {
		t.Fatalf("p11tool does not list the token:\n%s", out)
	}
}
