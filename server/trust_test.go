package server

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// vouch is the root ca's trust statement number seq vouching for cas.
func (ca *testCA) vouch(t testing.TB, seq uint64, cas ...*testCA) []byte {
	t.Helper()
	var certs []*x509.Certificate
	for _, c := range cas {
		certs = append(certs, c.cert)
	}
	b, err := certdir.SignTrustStatement(ca.signer, rand.Reader, certdir.NewTrustStatement(ca.cert, seq, time.Now(), certs))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// trustDir is a running reloader on a cert dir, for the trust tests.
type trustDir struct {
	t    *testing.T
	dir  string
	rl   *Reloader
	m    *Metrics
	logs *devtest.LockedBuffer
}

func newTrustDir(t *testing.T, sgn signer.Signer, files map[string][]byte) *trustDir {
	td := &trustDir{t: t, dir: t.TempDir(), logs: &devtest.LockedBuffer{}}
	td.write(files)
	cd := CertDir{Dir: td.dir, SignerPublic: sgn.Public()}
	creds, d, err := cd.Credentials()
	if err != nil {
		t.Fatal(err)
	}
	td.m = NewMetrics(prometheus.NewRegistry(), "file", true)
	log := slog.New(slog.NewJSONHandler(td.logs, nil))
	LogTrust(log, creds, td.m)
	svc, err := New(Config{Signer: sgn, Credentials: creds, Metrics: td.m})
	if err != nil {
		t.Fatal(err)
	}
	td.rl = &Reloader{Dir: cd, Service: svc, Metrics: td.m, Logger: log}
	td.rl.Prime(d, Digest{})
	return td
}

// write writes files (nil content removes the file) and reloads.
func (td *trustDir) write(files map[string][]byte) {
	for name, b := range files {
		p := filepath.Join(td.dir, name)
		if b == nil {
			_ = os.Remove(p)
			continue
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			td.t.Fatal(err)
		}
	}
	if td.rl != nil {
		td.rl.Check()
	}
}

// served returns the fingerprints of the `ca` set the service serves.
func (td *trustDir) served() []string {
	certs, err := pki.ParseCertificates(td.rl.Service.Credentials().Bundle())
	if err != nil {
		td.t.Fatal(err)
	}
	return certdir.Fingerprints(certs)
}

// want checks the served set, the trust gauge and that the logs name
// every fingerprint in logged.
func (td *trustDir) want(step string, served []*testCA, failed float64, logged ...*testCA) {
	td.t.Helper()
	var want []string
	for _, c := range served {
		want = append(want, pki.CertFingerprint(c.cert))
	}
	if got := td.served(); strings.Join(got, ",") != strings.Join(want, ",") {
		td.t.Errorf("%s: served %v, want %v", step, got, want)
	}
	if got := testutil.ToFloat64(td.m.reloadFailed.WithLabelValues(reloadTrust)); got != failed {
		td.t.Errorf("%s: trustd_reload_failed{what=trust} %v, want %v", step, got, failed)
	}
	for _, c := range logged {
		if !strings.Contains(td.logs.String(), pki.CertFingerprint(c.cert)) {
			td.t.Errorf("%s: no log line names %s\n%s", step, pki.CertFingerprint(c.cert), td.logs.String())
		}
	}
}

// TestTrustBundleRootVouched: write access to the cert dir must not choose
// the workers' client CAs. Against a running reloader: a
// self-signed ClientAuth CA written into accepted-cas.crt is not served
// (WARN, metric), a root-signed statement adding it is, a newer one
// removing it removes it, a replayed older statement is refused, and the
// running set stays.
func TestTrustBundleRootVouched(t *testing.T) {
	root, evil := newTestCA(t, signer.ECDSAP256), newTestCA(t, signer.ECDSAP256)
	token := []byte(testToken + "\n")
	// At start: the poisoned accepted-cas.crt is left out.
	td := newTrustDir(t, root.signer, map[string][]byte{certdir.FileToken: token, certdir.FileCACert: root.pem, certdir.FileAcceptedCAs: evil.pem})
	td.want("start with an unvouched CA", []*testCA{root}, 1, evil)
	if !strings.Contains(td.logs.String(), `"level":"WARN"`) {
		t.Errorf("no WARN at start:\n%s", td.logs.String())
	}
	// A self-signed CA's own statement vouches for nothing.
	td.write(map[string][]byte{certdir.FileTrustStatement: evil.vouch(t, 9, evil)})
	td.want("statement signed by another key", []*testCA{root}, 1)
	if got := testutil.ToFloat64(td.m.reloads.WithLabelValues(reloadTrust, "error")); got != 1 {
		t.Errorf("refused trust reloads %v, want 1", got)
	}
	// The root vouches: served, and the change is logged.
	td.write(map[string][]byte{certdir.FileTrustStatement: root.vouch(t, 1, evil)})
	td.want("root vouches", []*testCA{root, evil}, 0)
	if !strings.Contains(td.logs.String(), "the ca set served to workers") {
		t.Errorf("served set change not logged:\n%s", td.logs.String())
	}
	// trust remove: sequence 2 without it.
	td.write(map[string][]byte{certdir.FileAcceptedCAs: nil, certdir.FileTrustStatement: root.vouch(t, 2)})
	td.want("removed", []*testCA{root}, 0)
	// Replay: the old statement and the CA put back.
	td.write(map[string][]byte{certdir.FileAcceptedCAs: evil.pem, certdir.FileTrustStatement: root.vouch(t, 1, evil)})
	td.want("replayed statement", []*testCA{root}, 1)
	if !strings.Contains(td.logs.String(), "replayed") {
		t.Errorf("replay not named:\n%s", td.logs.String())
	}
}

// TestTrustRootChangeTiered: in the tiered setup os-ca.crt is not pinned
// by the signer's key, so a cert-dir writer could bring a root of their
// own with an issuer.crt they signed for the intermediate's public key.
// Refused; a rotation the running root vouched for is taken.
func TestTrustRootChangeTiered(t *testing.T) {
	tier := newTestTier(t, nil)
	evil, next := newTestCA(t, signer.ECDSAP256), newTestCA(t, signer.ECDSAP256)
	issuedBy := func(r *testCA) []byte {
		c, err := pki.NewIntermediateCertificate(r.cert, r.signer, tier.inter.signer.Public(), pki.IntermediateOptions{Subject: pkix.Name{CommonName: "node-a"}}, time.Now(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return pki.EncodeCertificates(c)
	}
	td := newTrustDir(t, tier.inter.signer, map[string][]byte{certdir.FileToken: []byte(testToken), certdir.FileCACert: tier.root.pem, certdir.FileIssuerChain: tier.inter.pem})
	td.want("start", []*testCA{tier.root}, 0)
	td.write(map[string][]byte{certdir.FileCACert: evil.pem, certdir.FileIssuerChain: issuedBy(evil), certdir.FileTrustStatement: evil.vouch(t, 7)})
	td.want("forged root", []*testCA{tier.root}, 1, evil)
	// Rotation: the running root vouches for the next one, then the next
	// becomes os-ca.crt.
	td.write(map[string][]byte{certdir.FileCACert: tier.root.pem, certdir.FileIssuerChain: tier.inter.pem, certdir.FileAcceptedCAs: next.pem, certdir.FileTrustStatement: tier.root.vouch(t, 1, next)})
	td.want("rotation started", []*testCA{tier.root, next}, 0)
	td.write(map[string][]byte{certdir.FileCACert: next.pem, certdir.FileIssuerChain: issuedBy(next), certdir.FileAcceptedCAs: nil, certdir.FileTrustStatement: next.vouch(t, 2)})
	td.want("rotation finished", []*testCA{next}, 0)
}

// TestRootPin: with TRUSTD_ROOT_SHA256 set, a cert dir whose os-ca.crt is
// another root — in the tiered setup, one a cert-dir writer brought with
// an issuer.crt forged for the intermediate's key — is refused at start,
// not only at reload.
func TestRootPin(t *testing.T) {
	tier := newTestTier(t, nil)
	evil := newTestCA(t, signer.ECDSAP256)
	forged, err := pki.NewIntermediateCertificate(evil.cert, evil.signer, tier.inter.signer.Public(), pki.IntermediateOptions{Subject: pkix.Name{CommonName: "node-a"}}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pin := pki.CertFingerprint(tier.root.cert)
	tests := []struct {
		name        string
		root, chain []byte
		pins        []string
		want        string
	}{
		{"pinned root", tier.root.pem, tier.inter.pem, []string{"00", pin}, ""},
		{"no pin, forged root taken at start", evil.pem, pki.EncodeCertificates(forged), nil, ""},
		{"pin, forged root", evil.pem, pki.EncodeCertificates(forged), []string{pin}, "not a root pinned"},
	}
	for _, tt := range tests {
		dir := t.TempDir()
		writeCertDir(t, dir, map[string][]byte{certdir.FileToken: []byte(testToken), certdir.FileCACert: tt.root, certdir.FileIssuerChain: tt.chain})
		_, _, err := CertDir{Dir: dir, SignerPublic: tier.inter.signer.Public(), RootPins: tt.pins}.Credentials()
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
}

// TestTrustEqualSequenceOtherSet: a statement that reuses the installed
// sequence number for another set of CAs (two statements the root signed
// under one number, e.g. from a restored ceremony directory) is refused
// like a replay: otherwise a cert-dir writer holding both could switch
// between them. The same set under the same number (a re-signed
// statement) is taken.
func TestTrustEqualSequenceOtherSet(t *testing.T) {
	root, a, b := newTestCA(t, signer.ECDSAP256), newTestCA(t, signer.ECDSAP256), newTestCA(t, signer.ECDSAP256)
	both := append(append([]byte(nil), a.pem...), b.pem...)
	td := newTrustDir(t, root.signer, map[string][]byte{certdir.FileToken: []byte(testToken), certdir.FileCACert: root.pem, certdir.FileAcceptedCAs: a.pem, certdir.FileTrustStatement: root.vouch(t, 3, a)})
	td.want("start", []*testCA{root, a}, 0)
	td.write(map[string][]byte{certdir.FileAcceptedCAs: both, certdir.FileTrustStatement: root.vouch(t, 3, a, b)})
	td.want("sequence 3 reused for another set", []*testCA{root, a}, 1)
	if !strings.Contains(td.logs.String(), "sequence 3") {
		t.Errorf("refusal does not name the sequence:\n%s", td.logs.String())
	}
	td.write(map[string][]byte{certdir.FileAcceptedCAs: a.pem, certdir.FileTrustStatement: root.vouch(t, 3, a)})
	td.want("same set re-signed under 3", []*testCA{root, a}, 0)
	td.write(map[string][]byte{certdir.FileAcceptedCAs: both, certdir.FileTrustStatement: root.vouch(t, 4, a, b)})
	td.want("sequence 4", []*testCA{root, a, b}, 0)
}

// TestTrustRefusalClearedWhenFilesReturn: a refused unvouched CA, then a
// broken token on top, then the running files back: no refusal gauge
// stays up (trustd_reload_failed{what="trust"} would page about a CA no
// longer in the cert dir). One left out since the start stays reported.
func TestTrustRefusalClearedWhenFilesReturn(t *testing.T) {
	root, evil := newTestCA(t, signer.ECDSAP256), newTestCA(t, signer.ECDSAP256)
	token := []byte(testToken + "\n")
	td := newTrustDir(t, root.signer, map[string][]byte{certdir.FileToken: token, certdir.FileCACert: root.pem})
	td.write(map[string][]byte{certdir.FileAcceptedCAs: evil.pem})
	td.want("unvouched CA refused", []*testCA{root}, 1)
	td.write(map[string][]byte{certdir.FileToken: []byte("\n")})
	td.write(map[string][]byte{certdir.FileToken: token, certdir.FileAcceptedCAs: nil})
	td.want("files back", []*testCA{root}, 0)
	if got := testutil.ToFloat64(td.m.reloadFailed.WithLabelValues("credentials")); got != 0 {
		t.Errorf("files back: trustd_reload_failed{what=credentials} %v, want 0", got)
	}

	td = newTrustDir(t, root.signer, map[string][]byte{certdir.FileToken: token, certdir.FileCACert: root.pem, certdir.FileAcceptedCAs: evil.pem})
	td.write(map[string][]byte{certdir.FileToken: []byte("\n")})
	td.write(map[string][]byte{certdir.FileToken: token})
	td.want("unvouched since the start", []*testCA{root}, 1)
}
