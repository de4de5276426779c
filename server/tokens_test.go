package server

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/signer"
)

// fingerprintOf is what an operator computes for a token line:
// printf %s TOKEN | sha256sum | cut -c1-16.
func fingerprintOf(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])[:16]
}

func TestTokenFingerprints(t *testing.T) {
	ts, err := parseTokens([]byte("alpha\n beta \n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := ts.fingerprints(); len(got) != 2 || got[0] != fingerprintOf("alpha") || got[1] != fingerprintOf("beta") {
		t.Errorf("fingerprints %v", got)
	}
	for _, fp := range ts.fingerprints() {
		if strings.Contains(fp, "alpha") || len(fp) != 16 {
			t.Errorf("fingerprint %q", fp)
		}
	}
}

// TestTokenReloadGuard: a token rotation by hand must not cause an
// outage. `openssl rand -hex 32 >> token` on a
// file without a trailing newline makes one long token; a reload that
// would leave no running token is refused (running set kept, WARN,
// trustd_reload_failed{what="token"}), a proper append is taken, and a
// forced reload replaces the set. A world-readable token file is warned
// about.
func TestTokenReloadGuard(t *testing.T) {
	ca := newTestCA(t, signer.ECDSAP256)
	const old, added = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	dir := t.TempDir()
	write := func(tok string, mode os.FileMode) {
		p := filepath.Join(dir, certdir.FileToken)
		if err := os.WriteFile(p, []byte(tok), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	writeCertDir(t, dir, map[string][]byte{certdir.FileCACert: ca.pem})
	write(old, 0o600) // no newline, as the files written before this fix
	cd := CertDir{Dir: dir, SignerPublic: ca.signer.Public()}
	creds, d, err := cd.Credentials()
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(prometheus.NewRegistry(), "file", true)
	svc, _ := New(Config{Signer: ca.signer, Credentials: creds, Metrics: m})
	var logs devtest.LockedBuffer
	rl := &Reloader{Dir: cd, Service: svc, Metrics: m, Logger: slog.New(slog.NewJSONHandler(&logs, nil))}
	rl.Prime(d, Digest{})
	tokens := func() string { return strings.Join(svc.Credentials().tokens.fingerprints(), ",") }
	failed := func() float64 { return testutil.ToFloat64(m.reloadFailed.WithLabelValues(reloadToken)) }

	write(old+added+"\n", 0o600) // the shell's >> on a file without a newline
	rl.Check()
	if tokens() != fingerprintOf(old) || failed() != 1 || !strings.Contains(logs.String(), `"level":"WARN","msg":"reload refused: the token file keeps no running token`) {
		t.Fatalf("glued token: running %s, gauge %v\n%s", tokens(), failed(), logs.String())
	}
	write(old+"\n"+added+"\n", 0o644)
	rl.Check()
	if tokens() != fingerprintOf(old)+","+fingerprintOf(added) || failed() != 0 {
		t.Fatalf("appended token: running %s, gauge %v", tokens(), failed())
	}
	if !strings.Contains(logs.String(), "readable by every user") {
		t.Errorf("no warning for a world-readable token file:\n%s", logs.String())
	}
	rl.ForceTokenReplace = true
	write("brand-new\n", 0o600)
	rl.Check()
	if tokens() != fingerprintOf("brand-new") {
		t.Errorf("forced replacement not installed: %s", tokens())
	}
}
