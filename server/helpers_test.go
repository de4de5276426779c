package server

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/file"
)

// testCA is a file-backed OS CA for tests.
type testCA struct {
	signer signer.Signer
	cert   *x509.Certificate
	pem    []byte
}

func newTestCA(t testing.TB, alg signer.Algorithm) *testCA {
	t.Helper()
	s, err := (&file.Backend{}).Generate(context.Background(), file.URI(filepath.Join(t.TempDir(), "ca.key")), alg)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pki.NewCACertificate(s, pki.CAOptions{Cluster: "test"}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{signer: s, cert: cert, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})}
}

func (ca *testCA) credentials(t testing.TB, token string) *Credentials {
	t.Helper()
	c, err := NewCredentials([]byte(token), ca.pem, nil, ca.signer.Public())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type csrSpec struct {
	key     crypto.Signer
	subject pkix.Name
	dns     []string
	ips     []net.IP
	mutate  func(*x509.CertificateRequest)
}

func newKey(t testing.TB, kind string) crypto.Signer {
	t.Helper()
	var k crypto.Signer
	var err error
	switch kind {
	case "ed25519":
		_, k, err = ed25519.GenerateKey(rand.Reader)
	case "p256":
		k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case "rsa2048":
		k, err = rsa.GenerateKey(rand.Reader, 2048)
	case "rsa1024":
		k, err = rsa.GenerateKey(rand.Reader, 1024)
	default:
		t.Fatalf("unknown key kind %s", kind)
	}
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func makeCSR(t testing.TB, s csrSpec) []byte {
	t.Helper()
	tmpl := &x509.CertificateRequest{Subject: s.subject, DNSNames: s.dns, IPAddresses: s.ips}
	if s.mutate != nil {
		s.mutate(tmpl)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, s.key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

type x509Cert = x509.Certificate

func pemCert(c *tls.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]})
}

func pemKey(t testing.TB, c *tls.Certificate) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// serveGRPC serves svc over TLS with holder's certificate on a loopback
// port until the test ends, and returns the address.
func serveGRPC(t *testing.T, svc *Service, holder *CertHolder) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := NewGRPCServer(svc, TLSConfig(holder.GetCertificate))
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	return ln.Addr().String()
}
