package server

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/signer"
)

func TestIssueProfile(t *testing.T) {
	cases := []struct {
		caAlg   signer.Algorithm
		csrKey  string
		wantSig x509.SignatureAlgorithm
	}{
		{signer.ECDSAP256, "ed25519", x509.ECDSAWithSHA256}, // Talos 1.9 workers under an ECDSA CA
		{signer.ECDSAP256, "p256", x509.ECDSAWithSHA256},
		{signer.ECDSAP384, "p256", x509.ECDSAWithSHA384},
		{signer.Ed25519, "p256", x509.PureEd25519},
		{signer.Ed25519, "ed25519", x509.PureEd25519},
		{signer.RSA2048, "ed25519", x509.SHA256WithRSA},
		{signer.ECDSAP256, "rsa2048", x509.ECDSAWithSHA256},
	}
	for _, c := range cases {
		t.Run(string(c.caAlg)+"/"+c.csrKey, func(t *testing.T) {
			ca := newTestCA(t, c.caAlg)
			csrPEM := makeCSR(t, csrSpec{
				key:     newKey(t, c.csrKey),
				subject: pkix.Name{CommonName: "worker-1", Organization: []string{"os:admin", "talos"}, ExtraNames: []pkix.AttributeTypeAndValue{{Type: asn1.ObjectIdentifier{2, 5, 4, 10}, Value: "os:admin"}}},
				dns:     []string{"worker-1", "worker-1.example"},
				ips:     []net.IP{net.ParseIP("10.5.0.2"), net.ParseIP("fd00::2")},
			})
			req, err := ParseRequest(csrPEM, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			issued, err := Issue(req, ca.cert, ca.signer, 24*time.Hour, now, rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			cert := parseIssued(t, issued)
			checkWorkerProfile(t, cert, now, c.wantSig)
			checkWorkerChain(t, cert, ca.cert)
		})
	}
}

// parseIssued parses what Issue returned and checks that the fields it
// reports are the certificate's.
func parseIssued(t *testing.T, issued *pki.Issued) *x509.Certificate {
	t.Helper()
	cert, err := x509.ParseCertificate(issued.Raw)
	if err != nil {
		t.Fatal(err)
	}
	if cert.SerialNumber.Cmp(issued.SerialNumber) != 0 || !cert.NotAfter.Equal(issued.NotAfter) {
		t.Errorf("Issued reports serial %x not after %v; the certificate has %x, %v", issued.SerialNumber, issued.NotAfter, cert.SerialNumber, cert.NotAfter)
	}
	return cert
}

// checkWorkerProfile checks the protocol's apid certificate profile on a
// certificate issued at now for worker-1's CSR.
func checkWorkerProfile(t *testing.T, cert *x509.Certificate, now time.Time, wantSig x509.SignatureAlgorithm) {
	t.Helper()
	if len(cert.Subject.Organization) != 0 {
		t.Errorf("Organization not stripped: %v", cert.Subject.Organization)
	}
	if cert.Subject.CommonName != "worker-1" {
		t.Errorf("CommonName %q", cert.Subject.CommonName)
	}
	if len(cert.ExtKeyUsage) != 1 || cert.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth || len(cert.UnknownExtKeyUsage) != 0 {
		t.Errorf("ExtKeyUsage %v, want exactly [ServerAuth]", cert.ExtKeyUsage)
	}
	if cert.KeyUsage != x509.KeyUsageDigitalSignature {
		t.Errorf("KeyUsage %v", cert.KeyUsage)
	}
	if cert.IsCA || !cert.BasicConstraintsValid {
		t.Errorf("IsCA=%v BasicConstraintsValid=%v", cert.IsCA, cert.BasicConstraintsValid)
	}
	if strings.Join(cert.DNSNames, ",") != "worker-1,worker-1.example" {
		t.Errorf("DNSNames %v", cert.DNSNames)
	}
	if len(cert.IPAddresses) != 2 || !cert.IPAddresses[0].Equal(net.ParseIP("10.5.0.2")) || !cert.IPAddresses[1].Equal(net.ParseIP("fd00::2")) {
		t.Errorf("IPAddresses %v", cert.IPAddresses)
	}
	if life := cert.NotAfter.Sub(now); life <= 12*time.Hour {
		t.Errorf("validity %v, must exceed 12 h", life)
	}
	if cert.SignatureAlgorithm != wantSig {
		t.Errorf("SignatureAlgorithm %v, want %v (from the CA key)", cert.SignatureAlgorithm, wantSig)
	}
	if cert.SerialNumber.BitLen() < 120 {
		t.Errorf("serial has %d bits", cert.SerialNumber.BitLen())
	}
}

// checkWorkerChain checks that cert verifies to ca for ServerAuth and
// never for ClientAuth.
func checkWorkerChain(t *testing.T, cert, ca *x509.Certificate) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "worker-1.example"}); err != nil {
		t.Errorf("issued certificate does not verify: %v", err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("issued certificate is valid for ClientAuth")
	}
}

func TestIssueClampsToCA(t *testing.T) {
	ca := newTestCA(t, signer.ECDSAP256)
	req, err := ParseRequest(makeCSR(t, csrSpec{key: newKey(t, "p256"), dns: []string{"w"}}), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Issue(req, ca.cert, ca.signer, 24*time.Hour, ca.cert.NotAfter.Add(time.Hour), rand.Reader); err == nil {
		t.Fatal("issued under an expired CA")
	}
}

func TestParseRequestRejects(t *testing.T) {
	good := func(t *testing.T) csrSpec { return csrSpec{key: newKey(t, "p256"), dns: []string{"w"}} }
	manyIPs := make([]net.IP, 65)
	for i := range manyIPs {
		manyIPs[i] = net.IPv4(10, 0, 0, byte(i+1))
	}
	cases := []struct {
		name string
		pem  func(t *testing.T) []byte
		want string
	}{
		{"empty", func(t *testing.T) []byte { return nil }, "empty"},
		{"not pem", func(t *testing.T) []byte { return []byte("hello") }, "not PEM"},
		{"wrong block", func(t *testing.T) []byte {
			return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}})
		}, "want CERTIFICATE REQUEST"},
		{"garbage der", func(t *testing.T) []byte {
			return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: []byte{0x30, 0x03, 1, 2, 3}})
		}, "parse"},
		{"too large", func(t *testing.T) []byte { return make([]byte, 65<<10) }, "limit"},
		{"trailing data", func(t *testing.T) []byte { return append(makeCSR(t, good(t)), "junk"...) }, "trailing"},
		{"bad signature", func(t *testing.T) []byte {
			b, _ := pem.Decode(makeCSR(t, good(t)))
			b.Bytes[len(b.Bytes)-3] ^= 0xff
			return pem.EncodeToMemory(b)
		}, "signature"},
		{"no SANs", func(t *testing.T) []byte {
			return makeCSR(t, csrSpec{key: newKey(t, "p256"), subject: pkix.Name{CommonName: "x"}})
		}, "no DNS name or IP"},
		{"too many SANs", func(t *testing.T) []byte { return makeCSR(t, csrSpec{key: newKey(t, "p256"), ips: manyIPs}) }, "65 SANs"},
		{"uri SAN", func(t *testing.T) []byte {
			s := good(t)
			s.mutate = func(r *x509.CertificateRequest) { r.URIs = []*url.URL{{Scheme: "spiffe", Host: "x"}} }
			return makeCSR(t, s)
		}, "URI"},
		{"email SAN", func(t *testing.T) []byte {
			s := good(t)
			s.mutate = func(r *x509.CertificateRequest) { r.EmailAddresses = []string{"a@b"} }
			return makeCSR(t, s)
		}, "e-mail"},
		{"wildcard", func(t *testing.T) []byte {
			return makeCSR(t, csrSpec{key: newKey(t, "p256"), dns: []string{"*.example"}})
		}, "not a valid DNS name"},
		{"unspecified ip", func(t *testing.T) []byte {
			return makeCSR(t, csrSpec{key: newKey(t, "p256"), ips: []net.IP{net.IPv4zero}})
		}, "unicast"},
		{"weak rsa", func(t *testing.T) []byte { return makeCSR(t, csrSpec{key: newKey(t, "rsa1024"), dns: []string{"w"}}) }, "too small"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseRequest(c.pem(t), Limits{})
			if err == nil {
				t.Fatal("accepted")
			}
			var reqErr *requestError
			if !errors.As(err, &reqErr) {
				t.Fatalf("error %T %v is not a request error", err, err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not mention %q", err, c.want)
			}
		})
	}
}

func TestPolicy(t *testing.T) {
	req, err := ParseRequest(makeCSR(t, csrSpec{key: newKey(t, "p256"), ips: []net.IP{net.ParseIP("10.5.0.2"), net.ParseIP("10.5.0.3")}}), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	p10 := netip.MustParsePrefix("10.5.0.0/24")
	cases := []struct {
		name   string
		policy Policy
		peer   string
		ok     bool
	}{
		{"off", Policy{}, "", true},
		{"inside", Policy{AllowedSANPrefixes: []netip.Prefix{p10}}, "", true},
		{"outside", Policy{AllowedSANPrefixes: []netip.Prefix{netip.MustParsePrefix("10.5.0.2/32")}}, "", false},
		{"peer matches", Policy{RequirePeerIP: true}, "10.5.0.3", true},
		{"peer v4-mapped", Policy{RequirePeerIP: true}, "::ffff:10.5.0.2", true},
		{"peer differs", Policy{RequirePeerIP: true}, "10.5.0.9", false},
		{"peer unknown", Policy{RequirePeerIP: true}, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var peer netip.Addr
			if c.peer != "" {
				peer = netip.MustParseAddr(c.peer)
			}
			err := c.policy.Check(req, peer)
			if (err == nil) != c.ok {
				t.Fatalf("Check = %v, want ok=%v", err, c.ok)
			}
			if err != nil {
				var polErr *policyError
				if !errors.As(err, &polErr) {
					t.Fatalf("%T is not a policy error", err)
				}
			}
		})
	}
}
