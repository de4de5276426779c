package server

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// testTier is an offline root with an online intermediate under it.
type testTier struct {
	root  *testCA
	inter *testCA // signer and certificate of the intermediate
}

func newTestTier(t *testing.T, eku []x509.ExtKeyUsage) *testTier {
	t.Helper()
	root := newTestCA(t, signer.ECDSAP256)
	inter := newTestCA(t, signer.ECDSAP256)
	c, err := pki.NewIntermediateCertificate(root.cert, root.signer, inter.signer.Public(), pki.IntermediateOptions{Subject: pkix.Name{CommonName: "node-a"}}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if eku != nil { // a deliberately wrong profile, re-signed by the root
		tmpl := *c
		tmpl.ExtKeyUsage = eku
		der, err := x509.CreateCertificate(rand.Reader, &tmpl, root.cert, inter.signer.Public(), root.signer)
		if err != nil {
			t.Fatal(err)
		}
		c, _ = x509.ParseCertificate(der)
	}
	inter.cert, inter.pem = c, pki.EncodeCertificates(c)
	return &testTier{root: root, inter: inter}
}

func (tt *testTier) files() CredentialFiles {
	return CredentialFiles{Token: []byte(testToken), CACert: tt.root.pem, IssuerChain: tt.inter.pem}
}

func TestTieredCredentials(t *testing.T) {
	tt := newTestTier(t, nil)
	c, err := LoadCredentials(tt.files(), tt.inter.signer.Public(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !c.Issuer().Equal(tt.inter.cert) || !c.CA().Equal(tt.root.cert) || !bytes.Equal(c.Bundle(), tt.root.pem) {
		t.Errorf("issuer %s, ca %s, bundle of %d", c.Issuer().Subject, c.CA().Subject, c.BundleSize())
	}
	if !c.IssuerNotAfter().Equal(tt.inter.cert.NotAfter) {
		t.Errorf("issuer expiry %v, want the intermediate's", c.IssuerNotAfter())
	}
	for name, eku := range map[string][]x509.ExtKeyUsage{
		"no EKU":     {},
		"ClientAuth": {x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		"anyEKU":     {x509.ExtKeyUsageAny},
	} {
		bad := newTestTier(t, eku)
		_, err := LoadCredentials(bad.files(), bad.inter.signer.Public(), time.Now())
		if err == nil || !strings.Contains(err.Error(), certdir.FileIssuerChain) {
			t.Errorf("%s: intermediate accepted or the file not named: %v", name, err)
		}
	}
	// The root's key is not the signer's in the tiered setup.
	if _, err := LoadCredentials(tt.files(), tt.root.signer.Public(), time.Now()); err == nil {
		t.Error("a chain not matching the signer was accepted")
	}
	// Without issuer.crt, os-ca.crt must be the signer's, as before.
	f := tt.files()
	f.IssuerChain = nil
	if _, err := LoadCredentials(f, tt.inter.signer.Public(), time.Now()); err == nil || !strings.Contains(err.Error(), certdir.FileIssuerChain) {
		t.Errorf("an intermediate key without issuer.crt: %v", err)
	}
}

// TestTieredRPC: `crt` is leaf + intermediate, `ca` the root only; the
// self-issued serving certificate is the intermediate's and is served
// with it, so a worker trusting only the root connects.
func TestTieredRPC(t *testing.T) {
	tt := newTestTier(t, nil)
	creds, err := LoadCredentials(tt.files(), tt.inter.signer.Public(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Config{Signer: tt.inter.signer, Credentials: creds, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	holder := &CertHolder{}
	si := &SelfIssuer{Holder: holder, Signer: tt.inter.signer, Credentials: svc.Credentials, Hosts: func() ([]string, error) { return []string{"127.0.0.1"}, nil }}
	if err := si.Issue(); err != nil {
		t.Fatal(err)
	}
	if n := len(holder.Get().Certificate); n != 2 {
		t.Fatalf("serving certificate sent with %d certificates, want leaf + intermediate", n)
	}
	addr := serveGRPC(t, svc, holder)
	roots := x509.NewCertPool()
	roots.AddCert(tt.root.cert)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	csr := makeCSR(t, csrSpec{key: newKey(t, "p256"), dns: []string{"worker"}, ips: []net.IP{net.ParseIP("10.0.0.5")}})
	resp, err := securityapi.NewSecurityServiceClient(conn).Certificate(withToken(testToken), &securityapi.CertificateRequest{Csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	checkTieredResponse(t, tt, resp)
}

func checkTieredResponse(t *testing.T, tt *testTier, resp *securityapi.CertificateResponse) {
	t.Helper()
	if !bytes.Equal(resp.Ca, tt.root.pem) {
		t.Errorf("ca holds more than the root: %q", resp.Ca)
	}
	chain, err := pki.ParseCertificates(resp.Crt)
	if err != nil || len(chain) != 2 || !chain[1].Equal(tt.inter.cert) {
		t.Fatalf("crt: %d certificates, %v; want leaf + intermediate", len(chain), err)
	}
	// As apid loads it and talosctl verifies it.
	opts := x509.VerifyOptions{Roots: x509.NewCertPool(), Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	opts.Roots.AppendCertsFromPEM(resp.Ca)
	opts.Intermediates.AddCert(chain[1])
	if _, err := chain[0].Verify(opts); err != nil {
		t.Errorf("leaf does not verify to the root through the intermediate: %v", err)
	}
}

// TestReloadIssuerChain: a new issuer.crt is checked before it replaces
// the old one; a bad one is refused and the running chain kept.
func TestReloadIssuerChain(t *testing.T) {
	tt := newTestTier(t, nil)
	dir := t.TempDir()
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(certdir.FileToken, []byte(testToken))
	write(certdir.FileCACert, tt.root.pem)
	write(certdir.FileIssuerChain, tt.inter.pem)
	cd := CertDir{Dir: dir, SignerPublic: tt.inter.signer.Public()}
	creds, d, err := cd.Credentials()
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Config{Signer: tt.inter.signer, Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	r := &Reloader{Dir: cd, Service: svc}
	r.Prime(d, Digest{})
	// An intermediate with ClientAuth for the same key: refused.
	bad := newTestTier(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth})
	badCert, err := x509.CreateCertificate(rand.Reader, bad.inter.cert, tt.root.cert, tt.inter.signer.Public(), tt.root.signer)
	if err != nil {
		t.Fatal(err)
	}
	write(certdir.FileIssuerChain, pki.EncodeCertificates(mustParse(t, badCert)))
	r.Check()
	if !svc.Credentials().Issuer().Equal(tt.inter.cert) {
		t.Fatal("a ClientAuth intermediate replaced the running one")
	}
	// A renewed intermediate for the same key: installed.
	renewed, err := pki.NewIntermediateCertificate(tt.root.cert, tt.root.signer, tt.inter.signer.Public(), pki.IntermediateOptions{Subject: pkix.Name{CommonName: "node-a"}, Validity: 48 * time.Hour}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	write(certdir.FileIssuerChain, pki.EncodeCertificates(renewed))
	r.Check()
	if !svc.Credentials().Issuer().Equal(renewed) {
		t.Fatal("the renewed intermediate was not installed")
	}
}

func mustParse(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSelfIssuerFollowsIssuerChain: a new issuer.crt makes the
// self-issued serving certificate due, so its served chain follows.
func TestSelfIssuerFollowsIssuerChain(t *testing.T) {
	tt := newTestTier(t, nil)
	creds, err := LoadCredentials(tt.files(), tt.inter.signer.Public(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cur := creds
	si := &SelfIssuer{Holder: &CertHolder{}, Signer: tt.inter.signer, Credentials: func() *Credentials { return cur },
		Hosts: func() ([]string, error) { return []string{"127.0.0.1", "192.0.2.1"}, nil }}
	if err := si.Issue(); err != nil {
		t.Fatal(err)
	}
	if si.NeedsRenewal() {
		t.Fatal("a fresh certificate is due")
	}
	_, ranges, _ := net.ParseCIDR("127.0.0.0/8")
	renewed, err := pki.NewIntermediateCertificate(tt.root.cert, tt.root.signer, tt.inter.signer.Public(), pki.IntermediateOptions{Subject: pkix.Name{CommonName: "node-a"}, PermittedIPRanges: []*net.IPNet{ranges}}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	f := tt.files()
	f.IssuerChain = pki.EncodeCertificates(renewed)
	if cur, err = LoadCredentials(f, tt.inter.signer.Public(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if !si.NeedsRenewal() {
		t.Fatal("a new issuer chain does not make the serving certificate due")
	}
	if err := si.Issue(); err != nil {
		t.Fatal(err)
	}
	leaf := si.Holder.Get().Leaf
	if len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(net.ParseIP("127.0.0.1")) {
		t.Errorf("serving IPs %v: an address outside the name constraints was kept", leaf.IPAddresses)
	}
}

func TestIssuerExpiryMetric(t *testing.T) {
	tt := newTestTier(t, nil)
	creds, err := LoadCredentials(tt.files(), tt.inter.signer.Public(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Config{Signer: tt.inter.signer, Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	now := time.Now()
	RegisterIssuerExpiry(reg, svc, func() time.Time { return now })
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != "trustd_issuer_expiry_seconds" {
		t.Fatalf("gathered %v, %v", mfs, err)
	}
	want := tt.inter.cert.NotAfter.Sub(now).Seconds()
	if got := mfs[0].GetMetric()[0].GetGauge().GetValue(); got != want {
		t.Errorf("issuer expiry %v, want %v (the intermediate's, not the root's)", got, want)
	}
}

// TestIssuerFile: replicas sharing one Secret name their own chain; a
// missing one is an error naming it, never a silent single-tier start.
func TestIssuerFile(t *testing.T) {
	tt := newTestTier(t, nil)
	dir := t.TempDir()
	for name, data := range map[string][]byte{certdir.FileToken: []byte(testToken), certdir.FileCACert: tt.root.pem, "node-a.crt": tt.inter.pem} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cd := CertDir{Dir: dir, IssuerFile: filepath.Join(dir, "node-a.crt"), SignerPublic: tt.inter.signer.Public()}
	c, _, err := cd.Credentials()
	if err != nil || !c.Issuer().Equal(tt.inter.cert) {
		t.Fatalf("issuer from IssuerFile: %v", err)
	}
	cd.IssuerFile = filepath.Join(dir, "node-b.crt")
	if _, _, err := cd.Credentials(); err == nil || !strings.Contains(err.Error(), "node-b.crt") {
		t.Errorf("missing issuer file: %v", err)
	}
}

func TestLogIssuerWarnsBeforeExpiry(t *testing.T) {
	tt := newTestTier(t, nil)
	short, err := pki.NewIntermediateCertificate(tt.root.cert, tt.root.signer, tt.inter.signer.Public(), pki.IntermediateOptions{Subject: pkix.Name{CommonName: "node-a"}, Validity: 48 * time.Hour}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		chain []byte
		want  string
	}{{tt.inter.pem, `"level":"INFO","msg":"signing with"`}, {pki.EncodeCertificates(short), `"level":"WARN"`}} {
		f := tt.files()
		f.IssuerChain = tc.chain
		c, err := LoadCredentials(f, tt.inter.signer.Public(), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		LogIssuer(slog.New(slog.NewJSONHandler(&buf, nil)), c, time.Now())
		if !strings.Contains(buf.String(), tc.want) || !strings.Contains(buf.String(), `"tiered":true`) {
			t.Errorf("log %s, want %s", buf.String(), tc.want)
		}
	}
}

// TestWorkerCertificateEndsWithChain: with a two-CA issuer chain whose
// upper CA expires before the signing intermediate, worker certificates
// end with the chain, not with the intermediate.
func TestWorkerCertificateEndsWithChain(t *testing.T) {
	now := time.Now()
	root, mid, inter := newTestCA(t, signer.ECDSAP256), newTestCA(t, signer.ECDSAP256), newTestCA(t, signer.ECDSAP256)
	ca := func(cn string, pathLen int, notAfter time.Time, parent, key *testCA, pub any) *x509.Certificate {
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: notAfter,
			IsCA: true, BasicConstraintsValid: true, MaxPathLen: pathLen, MaxPathLenZero: pathLen == 0,
			KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent.cert, pub, key.signer)
		if err != nil {
			t.Fatal(err)
		}
		return mustParse(t, der)
	}
	midCert := ca("mid", 1, now.Add(14*time.Hour), root, root, mid.signer.Public())
	mid.cert = midCert
	interCert := ca("node-a", 0, now.Add(365*24*time.Hour), mid, mid, inter.signer.Public())
	files := CredentialFiles{Token: []byte(testToken), CACert: root.pem, IssuerChain: pki.EncodeCertificates(interCert, midCert)}
	creds, err := LoadCredentials(files, inter.signer.Public(), now)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Config{Signer: inter.signer, Credentials: creds, Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	csr := makeCSR(t, csrSpec{key: newKey(t, "p256"), dns: []string{"worker"}})
	resp, err := svc.Certificate(ctxFrom("10.0.0.5"), &securityapi.CertificateRequest{Csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	certs, err := pki.ParseCertificates(resp.Crt)
	if err != nil || len(certs) != 3 {
		t.Fatalf("crt: %d certificates, %v", len(certs), err)
	}
	if certs[0].NotAfter.After(midCert.NotAfter) {
		t.Errorf("worker certificate ends %v, after its chain (%v)", certs[0].NotAfter, midCert.NotAfter)
	}
}
