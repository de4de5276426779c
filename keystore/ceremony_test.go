package keystore_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v4"

	"github.com/steward-trustd/steward-trustd/internal/apidtest"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/doctor"
	"github.com/steward-trustd/steward-trustd/internal/keyutil"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/file"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
)

var testNow = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

func newCeremony(t *testing.T) *keystore.Ceremony {
	t.Helper()
	reg, err := signer.NewRegistry(&file.Backend{}, &tpm.Backend{}) // tpm: refuses Ed25519 before it opens a device
	if err != nil {
		t.Fatal(err)
	}
	return &keystore.Ceremony{Keys: reg, Clock: func() time.Time { return testNow }, Rand: rand.Reader, Version: "test"}
}

// failDir fails writes of one file name.
type failDir struct {
	keystore.OSDir
	failOn string
}

func (d failDir) WriteFile(name string, data []byte, perm fs.FileMode, overwrite bool) error {
	if name == d.failOn {
		return errors.New("injected failure")
	}
	return d.OSDir.WriteFile(name, data, perm, overwrite)
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	_ = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	return out
}

func receiptOps(t *testing.T, d keystore.Dir) []string {
	t.Helper()
	rs, err := keystore.ReadReceipts(d)
	if err != nil {
		t.Fatal(err)
	}
	var ops []string
	for _, r := range rs {
		ops = append(ops, string(r.Operation))
	}
	return ops
}

func initCA(t *testing.T, c *keystore.Ceremony, root string) (string, keystore.OSDir) {
	t.Helper()
	uri := file.URI(filepath.Join(root, "ca.key"))
	d := keystore.OSDir{Root: filepath.Join(root, "ceremony")}
	if _, err := c.Init(context.Background(), d, keystore.InitOptions{SignerURI: uri, Cluster: "prod"}); err != nil {
		t.Fatal(err)
	}
	return uri, d
}

func TestInit(t *testing.T) {
	c := newCeremony(t)
	root := t.TempDir()
	uri, d := initCA(t, c, root)

	ca, err := pki.ParseCertificate(readFile(t, d.Path(certdir.FileCACert)))
	if err != nil {
		t.Fatal(err)
	}
	checkCAProfile(t, ca)
	file := string(readFile(t, d.Path(certdir.FileToken)))
	token, ok := strings.CutSuffix(file, "\n")
	if !ok || len(token) != 64 {
		t.Errorf("token file %q: want 64 hex characters and a newline (so that >> appends a line)", file)
	}
	checkModes(t, d, map[string]fs.FileMode{
		certdir.FileCACert: 0o644, certdir.FileToken: 0o600, certdir.FileWorkerPatch: 0o600, certdir.FileKubernetesSecret: 0o600,
	})
	checkInitWorkerPatch(t, d, token, ca)
	checkSecretHoldsNoKey(t, d)
	if got := receiptOps(t, d); strings.Join(got, " ") != "init.key init" {
		t.Errorf("receipts %v", got)
	}
	checkReceiptsOmit(t, d, token)
	checkInitRerunWritesNothing(t, c, d, uri)
}

// checkCAProfile checks that ca is a self-signed Talos OS CA for cluster
// "prod".
func checkCAProfile(t *testing.T, ca *x509.Certificate) {
	t.Helper()
	if !ca.IsCA || ca.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageDigitalSignature || ca.Subject.CommonName != "prod" ||
		len(ca.Subject.Organization) != 1 || ca.Subject.Organization[0] != "talos" || len(ca.SubjectKeyId) == 0 {
		t.Errorf("CA profile: %+v", ca.Subject)
	}
	if err := ca.CheckSignatureFrom(ca); err != nil {
		t.Errorf("self-signature: %v", err)
	}
}

// checkModes checks the permission bits of each file (name -> mode) of d.
func checkModes(t *testing.T, d keystore.Dir, modes map[string]fs.FileMode) {
	t.Helper()
	for name, mode := range modes {
		st, err := os.Stat(d.Path(name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s mode %04o, want %04o", name, st.Mode().Perm(), mode)
		}
	}
}

// checkInitWorkerPatch checks, with Talos's own machine config types, that
// the worker patch after init carries token and exactly ca.
func checkInitWorkerPatch(t *testing.T, d keystore.Dir, token string, ca *x509.Certificate) {
	t.Helper()
	patch, err := doctor.ParseWorkerConfig(readFile(t, d.Path(certdir.FileWorkerPatch)))
	if err != nil {
		t.Fatal(err)
	}
	if patch.Token != token {
		t.Error("patch machine.token differs from the token file")
	}
	if !patch.CA.Equal(ca) || patch.HasCAKey {
		t.Error("patch machine.ca is not exactly os-ca.crt without a key")
	}
	if len(patch.AcceptedCAs) != 0 {
		t.Error("patch has acceptedCAs outside a rotation")
	}
}

// checkSecretHoldsNoKey checks that the Kubernetes Secret holds no private
// key.
func checkSecretHoldsNoKey(t *testing.T, d keystore.Dir) {
	t.Helper()
	sec := string(readFile(t, d.Path(certdir.FileKubernetesSecret)))
	for _, s := range []string{"os-ca.key", base64.StdEncoding.EncodeToString([]byte("PRIVATE KEY"))[:12]} {
		if strings.Contains(sec, s) {
			t.Errorf("kubernetes secret mentions %q", s)
		}
	}
}

// checkReceiptsOmit checks that no receipt of d holds secret.
func checkReceiptsOmit(t *testing.T, d keystore.Dir, secret string) {
	t.Helper()
	for _, r := range mustReceipts(t, d) {
		raw, _ := yaml.Marshal(r)
		if strings.Contains(string(raw), secret) {
			t.Error("a receipt holds the token")
		}
	}
}

// checkInitRerunWritesNothing checks that a re-run of a completed init
// finds everything done and writes nothing.
func checkInitRerunWritesNothing(t *testing.T, c *keystore.Ceremony, d keystore.OSDir, uri string) {
	t.Helper()
	before := listDir(t, d.Root)
	res, err := c.Init(context.Background(), d, keystore.InitOptions{SignerURI: uri, Cluster: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.AlreadyDone {
		t.Error("re-run did not detect the completed init")
	}
	if after := listDir(t, d.Root); len(after) != len(before) {
		t.Errorf("re-run wrote files: %v -> %v", before, after)
	}
}

func mustReceipts(t *testing.T, d keystore.Dir) []keystore.Receipt {
	t.Helper()
	rs, err := keystore.ReadReceipts(d)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestInitResumesAfterFailure(t *testing.T) {
	c := newCeremony(t)
	root := t.TempDir()
	uri := file.URI(filepath.Join(root, "ca.key"))
	d := keystore.OSDir{Root: filepath.Join(root, "ceremony")}
	_, err := c.Init(context.Background(), failDir{OSDir: d, failOn: certdir.FileKubernetesSecret}, keystore.InitOptions{SignerURI: uri, Cluster: "prod"})
	if err == nil {
		t.Fatal("init succeeded despite the injected failure")
	}
	// Nothing half-written: only the key and its receipt exist.
	for _, n := range []string{certdir.FileCACert, certdir.FileToken, certdir.FileWorkerPatch} {
		if ok, _ := d.Exists(n); ok {
			t.Errorf("%s left behind after a failed init", n)
		}
	}
	if got := receiptOps(t, d); strings.Join(got, " ") != "init.key" {
		t.Errorf("receipts after failure %v", got)
	}
	keyBefore := readFile(t, filepath.Join(root, "ca.key"))
	res, err := c.Init(context.Background(), d, keystore.InitOptions{SignerURI: uri, Cluster: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Resumed) == 0 || !strings.Contains(res.Resumed[0], "earlier run") {
		t.Errorf("resume not reported: %v", res.Resumed)
	}
	if !bytes.Equal(keyBefore, readFile(t, filepath.Join(root, "ca.key"))) {
		t.Error("a second key was created")
	}
	ca, err := pki.ParseCertificate(readFile(t, d.Path(certdir.FileCACert)))
	if err != nil {
		t.Fatal(err)
	}
	k, _ := keyutil.ParsePrivateKeyPEM(keyBefore)
	if !pki.KeyMatchesCert(k.Public(), ca) {
		t.Error("resumed CA is not for the first key")
	}
}

func TestInitRefusals(t *testing.T) {
	ctx := context.Background()
	t.Run("foreign key at URI", func(t *testing.T) {
		c := newCeremony(t)
		root := t.TempDir()
		keyPath := filepath.Join(root, "ca.key")
		if _, err := (&file.Backend{}).Generate(ctx, file.URI(keyPath), signer.ECDSAP256); err != nil {
			t.Fatal(err)
		}
		d := keystore.OSDir{Root: filepath.Join(root, "ceremony")}
		_, err := c.Init(ctx, d, keystore.InitOptions{SignerURI: file.URI(keyPath), Cluster: "prod"})
		if !errors.Is(err, signer.ErrKeyExists) || !strings.Contains(err.Error(), "did not create it") {
			t.Fatalf("err = %v", err)
		}
		if files := listDir(t, d.Root); len(files) != 0 {
			t.Errorf("files written: %v", files)
		}
	})
	t.Run("existing CA without force", func(t *testing.T) {
		c := newCeremony(t)
		root := t.TempDir()
		_, d := initCA(t, c, root)
		newKey := filepath.Join(root, "other.key")
		_, err := c.Init(ctx, d, keystore.InitOptions{SignerURI: file.URI(newKey), Cluster: "prod"})
		if !errors.Is(err, keystore.ErrExists) {
			t.Fatalf("err = %v", err)
		}
		if _, err := os.Stat(newKey); !errors.Is(err, fs.ErrNotExist) {
			t.Error("a key was created although init was refused")
		}
		// With --force the files are replaced (the old key is untouched).
		if _, err := c.Init(ctx, d, keystore.InitOptions{SignerURI: file.URI(newKey), Cluster: "prod", Force: true}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("bad options", func(t *testing.T) {
		c := newCeremony(t)
		d := keystore.OSDir{Root: t.TempDir()}
		if _, err := c.Init(ctx, d, keystore.InitOptions{SignerURI: "file:/x", Cluster: ""}); err == nil {
			t.Error("empty cluster accepted")
		}
		if _, err := c.Init(ctx, d, keystore.InitOptions{SignerURI: "nope:x", Cluster: "c"}); !errors.Is(err, signer.ErrInvalidURI) {
			t.Errorf("bad scheme: %v", err)
		}
	})
}

func issueClient(t *testing.T, c *keystore.Ceremony, uri string, caPath string, trust []*x509.Certificate, roles []string, out string) []byte {
	t.Helper()
	ca, err := pki.ParseCertificate(readFile(t, caPath))
	if err != nil {
		t.Fatal(err)
	}
	od := keystore.OSDir{Root: filepath.Dir(out)}
	_, err = c.Talosconfig(context.Background(), keystore.OSDir{Root: filepath.Dir(caPath)}, keystore.TalosconfigOptions{
		SignerURI: uri, CA: ca, Trust: trust, Context: "prod", Endpoints: []string{"127.0.0.1"}, Roles: roles,
		Out: keystore.Target{Dir: od, Name: filepath.Base(out)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return readFile(t, out)
}

// apid starts an apid-like server whose serving certificate is issued by
// the daemon's issuing CA (as trustd does for workers) and whose client
// CAs are the bundle the daemon returns for d.
func apid(t *testing.T, c *keystore.Ceremony, uri string, d keystore.Dir) *apidtest.Server {
	t.Helper()
	ca, err := pki.ParseCertificate(readFile(t, d.Path(certdir.FileCACert)))
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.OpenCA(context.Background(), uri, ca)
	if err != nil {
		t.Fatal(err)
	}
	defer checkClose(t, s)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf, err := pki.NewServingCertificate(ca, s, key.Public(), []string{"127.0.0.1"}, time.Hour, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := trustBundle(d)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := apidtest.Start(tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}, bundle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { checkClose(t, srv) })
	return srv
}

// checkClose closes c and fails the test if that fails: a key handle or
// server that does not close cleanly leaks a device slot or a port.
func checkClose(t *testing.T, c io.Closer) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
}

func TestTalosconfigAndSignCSR(t *testing.T) {
	c := newCeremony(t)
	c.Clock = time.Now
	root := t.TempDir()
	uri, d := initCA(t, c, root)
	srv := apid(t, c, uri, d)

	tc := issueClient(t, c, uri, d.Path(certdir.FileCACert), nil, []string{"os:reader", "os:operator"}, filepath.Join(root, "talosconfig"))
	if st, _ := os.Stat(filepath.Join(root, "talosconfig")); st.Mode().Perm() != 0o600 {
		t.Errorf("talosconfig mode %04o", st.Mode().Perm())
	}
	roles, err := apidtest.Login(tc, srv.Addr(), "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if roles != "os:operator,os:reader" {
		t.Errorf("roles %q", roles)
	}

	// sign-csr: a CSR with extras gets exactly the client profile.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "alice", Organization: []string{"os:admin"}}, DNSNames: []string{"evil.example"},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	csrPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER})
	ca, _ := pki.ParseCertificate(readFile(t, d.Path(certdir.FileCACert)))
	out := keystore.Target{Dir: keystore.OSDir{Root: root}, Name: "alice.crt"}
	tests := []struct {
		name    string
		roles   []string
		csr     []byte
		wantErr string
	}{
		{"unknown role", []string{"os:root"}, csrPEM, "unknown role"},
		{"empty roles", nil, csrPEM, "no role"},
		{"impersonator", []string{"os:impersonator"}, csrPEM, "proxies only"},
		{"bad signature", []string{"os:admin"}, corrupt(csrPEM), "signature"},
		{"not a CSR", []string{"os:admin"}, readFile(t, d.Path(certdir.FileCACert)), "CERTIFICATE REQUEST"},
		{"ok", []string{"os:admin"}, csrPEM, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cert, _, err := c.SignCSR(context.Background(), d, keystore.SignCSROptions{SignerURI: uri, CA: ca, CSR: tt.csr, Roles: tt.roles, Out: out})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				if ok, _ := out.Dir.Exists(out.Name); ok {
					t.Error("output written despite the error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(cert.ExtKeyUsage) != 1 || cert.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth || cert.KeyUsage != x509.KeyUsageDigitalSignature ||
				len(cert.DNSNames) != 0 || cert.Subject.CommonName != "alice" || strings.Join(cert.Subject.Organization, ",") != "os:admin" {
				t.Errorf("client profile: eku %v ku %v dns %v subject %v", cert.ExtKeyUsage, cert.KeyUsage, cert.DNSNames, cert.Subject)
			}
			if _, err := apidtest.VerifyClient(cert); err != nil {
				t.Error(err)
			}
		})
	}
	if got := receiptOps(t, d); strings.Join(got, " ") != "init.key init talosconfig sign-csr" {
		t.Errorf("receipts %v", got)
	}
}

func corrupt(p []byte) []byte {
	b, _ := pem.Decode(p)
	der := append([]byte{}, b.Bytes...)
	der[len(der)-5] ^= 0xff
	return pem.EncodeToMemory(&pem.Block{Type: b.Type, Bytes: der})
}

func TestServerCert(t *testing.T) {
	c := newCeremony(t)
	root := t.TempDir()
	uri, d := initCA(t, c, root)
	ca, _ := pki.ParseCertificate(readFile(t, d.Path(certdir.FileCACert)))
	opts := keystore.ServerCertOptions{SignerURI: uri, CA: ca, Hosts: []string{"10.0.0.5", "api.prod.example"}, Out: d}
	cert, _, err := c.ServerCert(context.Background(), d, opts)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	for _, h := range opts.Hosts {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: h, CurrentTime: testNow}); err != nil {
			t.Errorf("%s: %v", h, err)
		}
	}
	if _, _, err := c.ServerCert(context.Background(), d, opts); !errors.Is(err, keystore.ErrExists) {
		t.Errorf("second server-cert without force: %v", err)
	}
	// A CA the key does not belong to is refused.
	other := filepath.Join(root, "other.key")
	if _, err := (&file.Backend{}).Generate(context.Background(), file.URI(other), signer.ECDSAP256); err != nil {
		t.Fatal(err)
	}
	opts.SignerURI, opts.Force = file.URI(other), true
	if _, _, err := c.ServerCert(context.Background(), d, opts); err == nil || !strings.Contains(err.Error(), "is not the key of CA") || !strings.Contains(err.Error(), "after rotate --finish") {
		t.Errorf("mismatched key: %v", err)
	}
}

func TestRotation(t *testing.T) {
	c := newCeremony(t)
	c.Clock = time.Now
	ctx := context.Background()
	root := t.TempDir()
	oldURI, d := initCA(t, c, root)
	newURI := file.URI(filepath.Join(root, "new.key"))
	if _, _, err := c.ServerCert(ctx, d, keystore.ServerCertOptions{SignerURI: oldURI, CA: mustCA(t, d, certdir.FileCACert), Hosts: []string{"127.0.0.1"}, Out: d}); err != nil {
		t.Fatal(err)
	}
	oldClient := issueClient(t, c, oldURI, d.Path(certdir.FileCACert), nil, []string{"os:admin"}, filepath.Join(root, "old.talosconfig"))

	startRotation(t, c, d, oldURI, newURI)
	next := checkRotationFiles(t, d)
	trust, _ := trustBundle(d)
	newClient := issueClient(t, c, newURI, d.Path(certdir.FileNextCACert), append(trust, next), []string{"os:admin"}, filepath.Join(root, "new.talosconfig"))

	during := apid(t, c, oldURI, d)
	for name, tc := range map[string][]byte{"old": oldClient, "new": newClient} {
		if _, err := apidtest.Login(tc, during.Addr(), "127.0.0.1"); err != nil {
			t.Errorf("during rotation, %s-CA client refused: %v", name, err)
		}
	}

	finishRotation(t, c, d, oldURI, newURI)
	checkFinishedRotation(t, d, next)
	after := apid(t, c, newURI, d)
	if _, err := apidtest.Login(newClient, after.Addr(), "127.0.0.1"); err != nil {
		t.Errorf("after finish, new-CA client refused: %v", err)
	}
	if _, err := apidtest.Login(oldClient, after.Addr(), "127.0.0.1"); err == nil {
		t.Error("after finish, old-CA client still accepted")
	}
	if got := receiptOps(t, d); strings.Join(got, " ") != "init.key init server-cert talosconfig rotate.key rotate talosconfig rotate.finish" {
		t.Errorf("receipts %v", got)
	}
}

// startRotation starts a rotation from oldURI to newURI in d, checking
// that finish is refused before the start, that the start needs the
// current root's key, and that a re-run of the start resumes rather than
// creating another key.
func startRotation(t *testing.T, c *keystore.Ceremony, d keystore.Dir, oldURI, newURI string) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.RotateFinish(ctx, d, keystore.RotateFinishOptions{NewSignerURI: newURI}); !errors.Is(err, keystore.ErrNoRotation) {
		t.Fatalf("finish before start: %v", err)
	}
	if _, err := c.Rotate(ctx, d, keystore.RotateOptions{NewSignerURI: newURI}); err == nil {
		t.Fatal("rotation started without the current root's key")
	}
	if _, err := c.Rotate(ctx, d, keystore.RotateOptions{SignerURI: oldURI, NewSignerURI: newURI}); err != nil {
		t.Fatal(err)
	}
	res, err := c.Rotate(ctx, d, keystore.RotateOptions{SignerURI: oldURI, NewSignerURI: newURI})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Resumed) != 2 || !res.AlreadyDone {
		t.Errorf("rotate re-run resumed %v, already done %v", res.Resumed, res.AlreadyDone)
	}
}

// checkRotationFiles checks the trust bundle and worker patch of d during
// a rotation and returns the next CA.
func checkRotationFiles(t *testing.T, d keystore.Dir) *x509.Certificate {
	t.Helper()
	oldCA, next := mustCA(t, d, certdir.FileCACert), mustCA(t, d, certdir.FileNextCACert)
	bundle, err := trustBundle(d)
	if err != nil || len(bundle) != 2 {
		t.Fatalf("bundle during rotation: %d CAs (%v)", len(bundle), err)
	}
	patch, err := doctor.ParseWorkerConfig(readFile(t, d.Path(certdir.FileWorkerPatch)))
	if err != nil {
		t.Fatal(err)
	}
	if len(patch.AcceptedCAs) != 1 || !patch.AcceptedCAs[0].Equal(next) || !patch.CA.Equal(oldCA) {
		t.Error("rotation worker patch: want machine.ca = old, acceptedCAs = [new]")
	}
	return next
}

// finishRotation finishes the rotation in d with newURI, after checking
// that finishing with the old key is refused.
func finishRotation(t *testing.T, c *keystore.Ceremony, d keystore.Dir, oldURI, newURI string) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.RotateFinish(ctx, d, keystore.RotateFinishOptions{NewSignerURI: oldURI}); err == nil {
		t.Error("finish with the old key accepted")
	}
	if _, err := c.RotateFinish(ctx, d, keystore.RotateFinishOptions{NewSignerURI: newURI}); err != nil {
		t.Fatal(err)
	}
}

// checkFinishedRotation checks that d holds only the new CA next, and a
// server certificate it issued, after a finished rotation.
func checkFinishedRotation(t *testing.T, d keystore.Dir, next *x509.Certificate) {
	t.Helper()
	if ok, _ := d.Exists(certdir.FileNextCACert); ok {
		t.Error("os-ca.next.crt left after finish")
	}
	if ok, _ := d.Exists(certdir.FileAcceptedCAs); ok {
		t.Error("accepted-cas.crt left after finish")
	}
	if !mustCA(t, d, certdir.FileCACert).Equal(next) {
		t.Error("os-ca.crt is not the new CA")
	}
	srv := mustCA(t, d, certdir.FileServerCert)
	if err := srv.CheckSignatureFrom(next); err != nil {
		t.Errorf("server.crt not re-issued by the new CA: %v", err)
	}
}

func mustCA(t *testing.T, d keystore.Dir, name string) *x509.Certificate {
	t.Helper()
	b, err := d.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pki.ParseCertificate(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestStatus(t *testing.T) {
	c := newCeremony(t)
	root := t.TempDir()
	uri, d := initCA(t, c, root)
	st, err := c.Status(context.Background(), uri, mustCA(t, d, certdir.FileCACert), d)
	if err != nil {
		t.Fatal(err)
	}
	if st.Key.Backend != "file" || !st.Key.Extractable || st.CA == nil || !st.CA.KeyMatches || st.CA.Expired || len(st.Receipts) != 2 || st.PolicyChecked {
		t.Errorf("status %+v ca %+v", st, st.CA)
	}
	c.Clock = func() time.Time { return testNow.Add(20 * 365 * 24 * time.Hour) }
	other := file.URI(filepath.Join(root, "o.key"))
	if _, err := (&file.Backend{}).Generate(context.Background(), other, signer.ECDSAP256); err != nil {
		t.Fatal(err)
	}
	st, err = c.Status(context.Background(), other, mustCA(t, d, certdir.FileCACert), nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.CA.KeyMatches || !st.CA.Expired {
		t.Errorf("mismatched, expired CA reported as %+v", st.CA)
	}
}

func TestServerCertUpdatesSecret(t *testing.T) {
	c := newCeremony(t)
	root := t.TempDir()
	uri, d := initCA(t, c, root)
	if _, _, err := c.ServerCert(context.Background(), d, keystore.ServerCertOptions{SignerURI: uri, CA: mustCA(t, d, certdir.FileCACert), Hosts: []string{"127.0.0.1"}, Out: d}); err != nil {
		t.Fatal(err)
	}
	var sec struct {
		Data map[string]string `yaml:"data"`
	}
	if err := yaml.Unmarshal(readFile(t, d.Path(certdir.FileKubernetesSecret)), &sec); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{certdir.FileCACert, certdir.FileToken, certdir.FileServerCert, certdir.FileServerKey} {
		got, err := base64.StdEncoding.DecodeString(sec.Data[n])
		if err != nil || !bytes.Equal(got, readFile(t, d.Path(n))) {
			t.Errorf("secret %s does not match the file (%v)", n, err)
		}
	}
	if len(sec.Data) != 4 {
		t.Errorf("secret keys %d, want 4", len(sec.Data))
	}
}

// trustBundle is the `ca` bundle the daemon serving d returns.
func trustBundle(d keystore.Dir) ([]*x509.Certificate, error) {
	_, bundle, err := certdir.ReadBundle(d)
	return bundle, err
}
