package softhsm_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/signer/pkcs11"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11/softhsm"
)

func TestToken(t *testing.T) {
	tok := softhsm.NewTest(t, "my token")
	if got := os.Getenv("SOFTHSM2_CONF"); got != tok.ConfPath {
		t.Fatalf("SOFTHSM2_CONF = %q, want %q", got, tok.ConfPath)
	}
	st, err := os.Stat(tok.PINFile)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("PIN file mode %04o", st.Mode().Perm())
	}
	out, err := tok.Util("--show-slots")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "my token") {
		t.Fatalf("--show-slots does not list the token:\n%s", out)
	}
	u, err := pkcs11.ParseURI(tok.URI("os ca", []byte{0, 1}, "allow-extractable=true"))
	if err != nil {
		t.Fatal(err)
	}
	if u.Token != "my token" || u.Object != "os ca" || string(u.ID) != "\x00\x01" || u.PINSource != tok.PINFile ||
		u.ModulePath != tok.ModulePath || !u.AllowExtractable {
		t.Fatalf("URI parses to %+v", u)
	}
	if err := tok.Remove(); err != nil {
		t.Fatal(err)
	}
	if out, _ := tok.Util("--show-slots"); strings.Contains(out, "my token") {
		t.Fatal("removed token still listed")
	}
	if err := tok.Restore(); err != nil {
		t.Fatal(err)
	}
	if out, _ := tok.Util("--show-slots"); !strings.Contains(out, "my token") {
		t.Fatal("restored token not listed")
	}
	if err := tok.Delete(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(tok.Dir, "tokens")); len(ents) != 0 {
		t.Fatalf("token directory not empty after Delete: %v", ents)
	}
}
