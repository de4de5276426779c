package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certlint"
)

// tier is a root and an intermediate under it, as the ceremony makes them.
type tier struct {
	root, inter       *x509.Certificate
	rootKey, interKey *ecdsa.PrivateKey
}

func newTier(t *testing.T, now time.Time, o IntermediateOptions) tier {
	t.Helper()
	var tr tier
	if o.Subject.CommonName == "" {
		o.Subject.CommonName = "node" // a CA's subject must not be empty (RFC 5280 §4.1.2.6)
	}
	tr.rootKey, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tr.interKey, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	var err error
	if tr.root, err = NewCACertificate(tr.rootKey, CAOptions{Cluster: "c"}, now, rand.Reader); err != nil {
		t.Fatal(err)
	}
	if tr.inter, err = NewIntermediateCertificate(tr.root, tr.rootKey, tr.interKey.Public(), o, now, rand.Reader); err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestIntermediateProfile(t *testing.T) {
	t.Parallel()
	now := time.Now()
	_, cidr, _ := net.ParseCIDR("10.0.0.0/8")
	tr := newTier(t, now, IntermediateOptions{Subject: pkix.Name{CommonName: "node-a"}, PermittedIPRanges: []*net.IPNet{cidr}})
	c := tr.inter
	if !c.IsCA || c.MaxPathLen != 0 || !c.MaxPathLenZero || c.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageDigitalSignature {
		t.Errorf("CA bits: isCA %v pathlen %d/%v ku %v", c.IsCA, c.MaxPathLen, c.MaxPathLenZero, c.KeyUsage)
	}
	if DescribeEKU(c) != "[ServerAuth]" || len(c.SubjectKeyId) == 0 || len(c.PermittedIPRanges) != 1 || c.NotAfter.Sub(now).Round(time.Minute) != DefaultIntermediateValidity {
		t.Errorf("eku %s ski %x ranges %v notAfter %v", DescribeEKU(c), c.SubjectKeyId, c.PermittedIPRanges, c.NotAfter)
	}
	if err := CheckIssuerChain([]*x509.Certificate{c}, []*x509.Certificate{tr.root}, tr.interKey.Public(), now); err != nil {
		t.Errorf("the ceremony's own intermediate is refused: %v", err)
	}
	long, err := NewIntermediateCertificate(tr.root, tr.rootKey, tr.interKey.Public(), IntermediateOptions{Subject: pkix.Name{CommonName: "node-b"}, Validity: 20 * DefaultCAValidity}, now, rand.Reader)
	if err != nil || !long.NotAfter.Equal(tr.root.NotAfter) {
		t.Errorf("intermediate not clamped to its root: %v %v", long.NotAfter, err)
	}
}

// TestServerAuthIntermediateCannotMintClientCerts is the design's claim
// (notes §1.4): a client certificate under the intermediate does not
// verify for ClientAuth to the root; one from the root does.
func TestServerAuthIntermediateCannotMintClientCerts(t *testing.T) {
	t.Parallel()
	now := time.Now()
	tr := newTier(t, now, IntermediateOptions{})
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rogue, err := NewClientCertificate(tr.inter, tr.interKey, k.Public(), "", []string{"os:admin"}, 0, now, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	legit, err := NewClientCertificate(tr.root, tr.rootKey, k.Public(), "", []string{"os:admin"}, 0, now, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	opts := x509.VerifyOptions{Roots: x509.NewCertPool(), Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	opts.Roots.AddCert(tr.root)
	opts.Intermediates.AddCert(tr.inter)
	if _, err := rogue.Verify(opts); err == nil {
		t.Error("a client certificate issued by the ServerAuth-only intermediate verified")
	}
	if _, err := legit.Verify(opts); err != nil {
		t.Errorf("the root's client certificate: %v", err)
	}
}

func TestCheckIssuerChain(t *testing.T) {
	t.Parallel()
	now := time.Now()
	tr := newTier(t, now, IntermediateOptions{})
	other := newTier(t, now, IntermediateOptions{})
	bad := func(mutate func(*x509.Certificate)) *x509.Certificate {
		tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: "bad"}, IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
			KeyUsage: x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		mutate(tmpl)
		tmpl.NotBefore, tmpl.NotAfter, tmpl.SerialNumber = now, now.Add(time.Hour), big.NewInt(2)
		// Signed past the lints (which refuse most of these): what a
		// chain from elsewhere may hold.
		return createUnlinted(t, tmpl, tr.root, tr.interKey.Public(), tr.rootKey)
	}
	tests := []struct {
		name    string
		chain   []*x509.Certificate
		wantErr string
	}{
		{"good", []*x509.Certificate{tr.inter}, ""},
		{"empty", nil, "no certificate"},
		{"no EKU", []*x509.Certificate{bad(func(c *x509.Certificate) { c.ExtKeyUsage = nil })}, "has no ExtKeyUsage"},
		{"ClientAuth", []*x509.Certificate{bad(func(c *x509.Certificate) {
			c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		})}, "allows ClientAuth"},
		{"anyEKU", []*x509.Certificate{bad(func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageAny} })}, "anyExtendedKeyUsage"},
		{"CodeSigning", []*x509.Certificate{bad(func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning} })}, "want exactly [ServerAuth]"},
		{"pathlen 1", []*x509.Certificate{bad(func(c *x509.Certificate) { c.MaxPathLen, c.MaxPathLenZero = 1, false })}, "path length 0"},
		{"no pathlen", []*x509.Certificate{bad(func(c *x509.Certificate) { c.MaxPathLen, c.MaxPathLenZero = -1, false })}, "path length 0"},
		{"not a CA", []*x509.Certificate{bad(func(c *x509.Certificate) { c.IsCA, c.MaxPathLenZero = false, false })}, "not a CA"},
		{"no keyCertSign", []*x509.Certificate{bad(func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageDigitalSignature })}, "lacks keyUsage keyCertSign"},
		{"outlives the root", []*x509.Certificate{outliving(t, tr, now)}, "after the root"},
		{"root included", []*x509.Certificate{tr.inter, tr.root}, "is a root"},
		{"another root's", []*x509.Certificate{other.inter}, "not the signer key's"},
	}
	for _, tt := range tests {
		pub := tr.interKey.Public()
		err := CheckIssuerChain(tt.chain, []*x509.Certificate{tr.root}, pub, now)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%s: err = %v, want %q", tt.name, err, tt.wantErr)
		}
	}
	if err := CheckIssuerChain([]*x509.Certificate{other.inter}, []*x509.Certificate{tr.root}, other.interKey.Public(), now); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Errorf("an intermediate of another root: %v", err)
	}
	if err := CheckIssuerChain([]*x509.Certificate{tr.inter}, []*x509.Certificate{tr.root}, tr.interKey.Public(), tr.inter.NotAfter.Add(time.Hour)); err == nil {
		t.Error("an expired intermediate passed")
	}
}

// outliving signs tr's intermediate key with the intermediate profile but
// a NotAfter an hour past the root's, as a hand-made issuer.crt could
// (issue() clamps to the issuer, so x509.CreateCertificate directly).
func outliving(t *testing.T, tr tier, now time.Time) *x509.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "outliving"},
		NotBefore: now.Add(-time.Minute), NotAfter: tr.root.NotAfter.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tr.root, tr.interKey.Public(), tr.rootKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestNameConstraintsBindACompromisedIntermediate: an intermediate signed
// with IP name constraints can still sign a leaf for any address (that is
// what a compromised node would do), but Go's verifier — talosctl's —
// refuses the chain for an address outside the ranges.
func TestNameConstraintsBindACompromisedIntermediate(t *testing.T) {
	t.Parallel()
	now := time.Now()
	_, ranges, _ := net.ParseCIDR("10.0.0.0/8")
	tr := newTier(t, now, IntermediateOptions{PermittedIPRanges: []*net.IPNet{ranges}})
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tests := []struct {
		ip      string
		wantErr bool
	}{{"10.5.0.2", false}, {"192.168.1.1", true}, {"127.0.0.1", true}}
	for _, tt := range tests {
		req := WorkerRequest{Subject: pkix.Name{CommonName: "w"}, IPs: []net.IP{net.ParseIP(tt.ip)}, PublicKey: leafKey.Public()}
		_, err := NewWorkerCertificate(tr.inter, tr.interKey, req, time.Hour, now, rand.Reader)
		var lintErr *certlint.Error
		if tt.wantErr != errors.As(err, &lintErr) {
			t.Errorf("leaf for %s: our issuance gave %v, want a lint refusal: %v", tt.ip, err, tt.wantErr)
		}
		// What a compromised node would sign without our lints.
		tmpl := &x509.Certificate{Subject: req.Subject, IPAddresses: req.IPs, SerialNumber: big.NewInt(3), NotBefore: now, NotAfter: now.Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		leaf := createUnlinted(t, tmpl, tr.inter, leafKey.Public(), tr.interKey)
		_, err = leaf.Verify(x509.VerifyOptions{Roots: pool(tr.root), Intermediates: pool(tr.inter), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		var ci x509.CertificateInvalidError
		if tt.wantErr != (err != nil) || tt.wantErr && (!errors.As(err, &ci) || ci.Reason != x509.CANotAuthorizedForThisName) {
			t.Errorf("leaf for %s: %v, want refused: %v", tt.ip, err, tt.wantErr)
		}
	}
}

func pool(certs ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

// createUnlinted signs tmpl with x509 directly, past the lints: fixtures
// for what the verifiers must refuse.
func createUnlinted(t *testing.T, tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) *x509.Certificate {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
