package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certlint"
	"github.com/steward-trustd/steward-trustd/signer/signertest"
)

// lintFixture is a root and an intermediate with IP name constraints, and
// the good issuance of every certificate kind under them, built as the
// profiles build them.
type lintFixture struct {
	root, inter       *x509.Certificate
	rootKey, interKey crypto.Signer
	leafPub           crypto.PublicKey
}

func newLintFixture(t *testing.T, now time.Time) lintFixture {
	t.Helper()
	_, ranges, _ := net.ParseCIDR("10.0.0.0/8")
	tr := newTier(t, now, IntermediateOptions{PermittedIPRanges: []*net.IPNet{ranges}})
	leaf, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	return lintFixture{root: tr.root, inter: tr.inter, rootKey: tr.rootKey, interKey: tr.interKey, leafPub: leaf.Public()}
}

// good returns the issuance of kind exactly as the profile builds it.
func (f lintFixture) good(kind certlint.Kind, now time.Time) issuance {
	is := issuance{kind: kind, ca: f.root, key: f.rootKey, pub: f.leafPub, lifetime: time.Hour, now: now, rand: rand.Reader}
	leaf := x509.Certificate{Subject: pkix.Name{CommonName: "w"}, KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true}
	switch kind {
	case certlint.Root:
		ski, _ := SubjectKeyID(f.rootKey.Public())
		is.ca, is.pub = nil, f.rootKey.Public()
		is.tmpl = &x509.Certificate{Subject: pkix.Name{CommonName: "c", Organization: []string{"talos"}}, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, BasicConstraintsValid: true, IsCA: true, SubjectKeyId: ski, AuthorityKeyId: ski}
	case certlint.Intermediate:
		ski, _ := SubjectKeyID(f.leafPub)
		is.tmpl = &x509.Certificate{Subject: pkix.Name{CommonName: "node-b"}, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true, SubjectKeyId: ski}
	case certlint.Worker, certlint.Serving:
		leaf.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		leaf.IPAddresses = []net.IP{net.ParseIP("10.5.0.2")}
		is.tmpl, is.ca, is.key = &leaf, f.inter, f.interKey
	case certlint.Client:
		leaf.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		leaf.Subject.Organization = []string{"os:admin"}
		is.tmpl = &leaf
	}
	return is
}

// TestLintRefusesBeforeTheDevice injects one fault into each kind's
// profile and checks that the lint names it and that the CA key was never
// asked; the unchanged profile signs exactly once.
func TestLintRefusesBeforeTheDevice(t *testing.T) {
	t.Parallel()
	now := time.Now()
	f := newLintFixture(t, now)
	tests := []struct {
		kind   certlint.Kind
		fault  string
		inject func(*x509.Certificate)
		lint   string
	}{
		{certlint.Root, "not a CA", func(c *x509.Certificate) { c.IsCA = false }, "e_talos_ca_basic_constraints"},
		{certlint.Root, "keyEncipherment on ECDSA", func(c *x509.Certificate) { c.KeyUsage |= x509.KeyUsageKeyEncipherment }, "e_talos_key_usage_for_key_type"},
		{certlint.Intermediate, "path length 1", func(c *x509.Certificate) { c.MaxPathLen, c.MaxPathLenZero = 1, false }, "e_talos_intermediate_path_len_zero"},
		{certlint.Intermediate, "ClientAuth added", addClientAuth, "e_talos_server_eku_exactly_server_auth"},
		{certlint.Worker, "ClientAuth added", addClientAuth, "e_talos_server_eku_exactly_server_auth"},
		{certlint.Worker, "SAN outside the name constraints", func(c *x509.Certificate) { c.IPAddresses = []net.IP{net.ParseIP("192.168.1.1")} }, "e_talos_ip_san_within_name_constraints"},
		{certlint.Worker, "Organization", func(c *x509.Certificate) { c.Subject.Organization = []string{"os:admin"} }, "e_talos_worker_no_organization"},
		{certlint.Worker, "a CA", func(c *x509.Certificate) { c.IsCA = true }, "e_talos_leaf_not_ca"},
		{certlint.Serving, "ClientAuth added", addClientAuth, "e_talos_server_eku_exactly_server_auth"},
		{certlint.Client, "ServerAuth added", func(c *x509.Certificate) { c.ExtKeyUsage = append(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth) }, "e_talos_client_eku_exactly_client_auth"},
		{certlint.Client, "unknown role", func(c *x509.Certificate) { c.Subject.Organization = []string{"os:root"} }, "e_talos_client_known_roles"},
		{certlint.Client, "no digitalSignature (RFC 5280 zlint)", func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageCertSign }, "e_ext_key_usage_cert_sign_without_ca"},
	}
	for _, tt := range tests {
		t.Run(string(tt.kind)+"/"+tt.fault, func(t *testing.T) {
			t.Parallel()
			is := f.good(tt.kind, now)
			tt.inject(is.tmpl)
			counting := signertest.NewCounting(is.key)
			is.key = counting
			_, _, err := sign(is)
			var lintErr *certlint.Error
			if !errors.As(err, &lintErr) || !slices.Contains(lintErr.Names(), tt.lint) {
				t.Fatalf("err = %v, want a lint error naming %s", err, tt.lint)
			}
			if counting.Count() != 0 {
				t.Errorf("the CA key signed %d times for a refused certificate", counting.Count())
			}
		})
	}
}

func addClientAuth(c *x509.Certificate) {
	c.ExtKeyUsage = append(c.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
}

// TestLintedProfilesSign checks every kind's profile passes the lints
// (leaves warn only that they carry no SubjectKeyIdentifier, a SHOULD of
// RFC 5280 §4.2.1.2 that Talos's profile leaves out), signs once, and that the signed certificate carries
// exactly the linted to-be-signed bytes and verifies under its issuer.
func TestLintedProfilesSign(t *testing.T) {
	t.Parallel()
	now := time.Now()
	f := newLintFixture(t, now)
	for _, kind := range []certlint.Kind{certlint.Root, certlint.Intermediate, certlint.Serving, certlint.Worker, certlint.Client} {
		is := f.good(kind, now)
		counting := signertest.NewCounting(is.key)
		is.key = counting
		der, warnings, err := sign(is)
		want := []string{"w_ext_subject_key_identifier_missing_sub_cert"}
		if kind == certlint.Root || kind == certlint.Intermediate {
			want = nil
		}
		if err != nil || !slices.Equal(warnings, want) {
			t.Fatalf("%s: err %v, warnings %v", kind, err, warnings)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		issuer := is.ca
		if issuer == nil {
			issuer = c
		}
		if err := c.CheckSignatureFrom(issuer); err != nil || counting.Count() != 1 {
			t.Errorf("%s: signature %v after %d device signatures", kind, err, counting.Count())
		}
	}
}

// TestLintThenSignEveryKeyType signs through every CA key algorithm the
// signers hold: the digest x509 picks for the CA key's algorithm must be
// the one the CA key's signature verifies over.
func TestLintThenSignEveryKeyType(t *testing.T) {
	t.Parallel()
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	for _, key := range []crypto.Signer{p384, ed, rsaKey} {
		ca, err := NewCACertificate(key, CAOptions{Cluster: "c"}, time.Now(), rand.Reader)
		if err != nil {
			t.Fatalf("%T: %v", key, err)
		}
		leaf, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		w := WorkerRequest{Subject: pkix.Name{CommonName: "w"}, DNSNames: []string{"w"}, PublicKey: leaf.Public()}
		is, err := NewWorkerCertificate(ca, key, w, time.Hour, time.Now(), rand.Reader)
		if err != nil {
			t.Fatalf("%T: %v", key, err)
		}
		c, err := x509.ParseCertificate(is.Raw)
		if err != nil || c.CheckSignatureFrom(ca) != nil {
			t.Errorf("%T: worker certificate %v", key, err)
		}
	}
}

// TestLintedCopyIsTheTBS checks that the certificate the lints see is
// made of exactly the TBS the CA key signs, under the algorithm the TBS
// names, for every CA key algorithm.
func TestLintedCopyIsTheTBS(t *testing.T) {
	t.Parallel()
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	for _, key := range []crypto.Signer{p256, ed, rsaKey} {
		ca, err := NewCACertificate(key, CAOptions{Cluster: "c"}, time.Now(), rand.Reader)
		if err != nil {
			t.Fatalf("%T: %v", key, err)
		}
		der, err := certificateOf(ca.RawTBSCertificate, placeholderSignature(key.Public()))
		if err != nil {
			t.Fatalf("%T: %v", key, err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatalf("%T: linted copy does not parse: %v", key, err)
		}
		if !bytes.Equal(c.RawTBSCertificate, ca.RawTBSCertificate) || c.SignatureAlgorithm != ca.SignatureAlgorithm {
			t.Errorf("%T: linted copy has another TBS or algorithm (%s, want %s)", key, c.SignatureAlgorithm, ca.SignatureAlgorithm)
		}
		if !bytes.Equal(tbsOf(der), ca.RawTBSCertificate) {
			t.Errorf("%T: tbsOf does not find the TBS", key)
		}
	}
}

// flippingSigner is a faulty device: it returns a signature with one bit
// changed.
type flippingSigner struct{ crypto.Signer }

func (f flippingSigner) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	sig, err := f.Signer.Sign(r, digest, opts)
	if err == nil {
		sig[len(sig)-1] ^= 1
	}
	return sig, err
}

// TestFaultyDeviceSignatureRefused checks that a signature that does not
// verify under the CA key never becomes a certificate, and says so.
func TestFaultyDeviceSignatureRefused(t *testing.T) {
	t.Parallel()
	now := time.Now()
	f := newLintFixture(t, now)
	is := f.good(certlint.Worker, now)
	is.key = flippingSigner{is.key}
	der, _, err := sign(is)
	if der != nil || err == nil || !strings.Contains(err.Error(), "signing device returned a signature that does not verify") {
		t.Fatalf("faulty device: der %d bytes, err %v", len(der), err)
	}
}
