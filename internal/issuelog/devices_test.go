package issuelog_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/issuelog"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11/softhsm"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// TestLogKeyOnDevices appends to a log whose checkpoints a SoftHSM
// object and an swtpm key sign, and verifies it with the printed
// verifier key. CI runs both (STEWARD_REQUIRE_DEVICES): missing tools fail.
func TestLogKeyOnDevices(t *testing.T) {
	t.Run("softhsm", func(t *testing.T) {
		tok := softhsm.NewTest(t, "log")
		appendVerify(t, &pkcs11.Backend{}, tok.URI("log-key", nil))
	})
	t.Run("swtpm", func(t *testing.T) {
		sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
		appendVerify(t, &tpm.Backend{Dial: tpmsim.Dial}, "tpm:path="+filepath.Join(t.TempDir(), "log.tpmkey")+";"+sw.URIAttrs()+";timeout=5s")
	})
}

func appendVerify(t *testing.T, b signer.Backend, uri string) {
	t.Helper()
	key, err := b.Generate(context.Background(), uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	defer key.Close()
	ns, err := issuelog.NewNoteSigner("steward-trustd.test/device", key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	l, err := issuelog.Open(dir, issuelog.Options{Signer: ns, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := l.Append(context.Background(), fmt.Appendf(nil, `{"v":1,"event":"denied","reason":"%d"}`, i)); err != nil {
			t.Fatal(err)
		}
		if i%5 == 4 {
			if err := l.SignCheckpoint(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	snap, err := issuelog.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := issuelog.Verify(snap, ns.Verifier()); err != nil || !r.OK() || r.Entries != 20 || r.Checkpoints != 5 {
		t.Fatalf("%v %+v", err, r)
	}
}
