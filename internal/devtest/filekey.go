package devtest

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/keyutil"
	"github.com/steward-trustd/steward-trustd/signer"
)

// FileKey writes a fresh ECDSA P-256 key to dir/NAME.key (mode 0600, the
// file backend's own PEM encoding) and returns its file: key URI, e.g. a
// policy authority or an offline root kept on an air-gapped machine.
func FileKey(tb testing.TB, dir, name string) string {
	tb.Helper()
	k, err := keyutil.GenerateKey(rand.Reader, signer.ECDSAP256)
	if err != nil {
		tb.Fatal(err)
	}
	data, err := keyutil.MarshalPrivateKeyPEM(k)
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(dir, name+".key")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatal(err)
	}
	return "file:" + path
}
