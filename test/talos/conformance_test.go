package talos

import (
	"crypto/tls"
	stdx509 "crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	talosx509 "github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/grpc/gen"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
)

// workerCSR selects how the simulated worker builds its key and CSR.
type workerCSR int

const (
	// csrFromCA is Talos 1.10+: a key matching the last accepted CA.
	csrFromCA workerCSR = iota
	// csrEd25519 is Talos 1.9: always Ed25519, whatever the CA.
	csrEd25519
)

// workerRequest runs Talos's own worker code against addr: it builds the
// apid CSR the way machined does and sends it through RemoteGenerator. It
// returns the `ca` bundle and the issued certificate, or the error.
func workerRequest(t *testing.T, addr, token string, caPEM []byte, mode workerCSR, timeout time.Duration) ([]byte, []byte, *talosx509.PEMEncodedCertificateAndKey, error) {
	t.Helper()
	accepted := []*talosx509.PEMEncodedCertificate{{Crt: caPEM}}
	caCert, err := accepted[len(accepted)-1].GetCert()
	if err != nil {
		t.Fatal(err)
	}
	opts := []talosx509.Option{
		talosx509.IPAddresses([]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.5.0.2")}),
		talosx509.DNSNames([]string{"worker-1", "worker-1.cluster.local"}),
		talosx509.CommonName("worker-1.cluster.local"),
	}
	var csr *talosx509.CertificateSigningRequest
	var identity *talosx509.PEMEncodedCertificateAndKey
	switch mode {
	case csrFromCA:
		csr, identity, err = talosx509.NewCSRAndIdentityFromCA(caCert, opts...)
	case csrEd25519:
		csr, identity, err = talosx509.NewEd25519CSRAndIdentity(opts...)
	}
	if err != nil {
		t.Fatal(err)
	}
	remote, err := gen.NewRemoteGenerator(token, []string{addr}, accepted)
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	ca, crt, err := remote.IdentityContext(ctxTimeout(t, timeout), csr)
	return ca, crt, identity, err
}

// checkIssued checks what a worker would do with the answer: apid loads
// `ca` as its client-CA pool and serves crt with its own key.
func checkIssued(t *testing.T, caBundle, crt []byte, identity *talosx509.PEMEncodedCertificateAndKey, wantCAs [][]byte) {
	t.Helper()
	pool := stdx509.NewCertPool()
	if !pool.AppendCertsFromPEM(caBundle) {
		t.Fatalf("returned ca is not a parseable PEM bundle: %q", caBundle)
	}
	for _, want := range wantCAs {
		if !strings.Contains(string(caBundle), strings.TrimSpace(string(want))) {
			t.Errorf("returned ca lacks an expected CA")
		}
	}
	if n := strings.Count(string(caBundle), "BEGIN CERTIFICATE"); n != len(wantCAs) {
		t.Errorf("returned ca has %d certificates, want exactly %d", n, len(wantCAs))
	}
	if _, err := tls.X509KeyPair(crt, identity.Key); err != nil {
		t.Fatalf("issued certificate does not match the worker's key: %v", err)
	}
	block, _ := pem.Decode(crt)
	cert, err := stdx509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"10.5.0.2", "worker-1.cluster.local"} {
		if _, err := cert.Verify(stdx509.VerifyOptions{Roots: pool, DNSName: name, KeyUsages: []stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("issued certificate does not verify for %s against the returned ca: %v", name, err)
		}
	}
	if len(cert.Subject.Organization) != 0 || cert.IsCA || len(cert.ExtKeyUsage) != 1 || cert.ExtKeyUsage[0] != stdx509.ExtKeyUsageServerAuth {
		t.Errorf("profile broken: O=%v CA=%v EKU=%v", cert.Subject.Organization, cert.IsCA, cert.ExtKeyUsage)
	}
	if life := time.Until(cert.NotAfter); life <= 12*time.Hour {
		t.Errorf("issued certificate lives %v, workers renew every 12 h", life)
	}
}

// TestFileBackend runs Talos's worker client against the daemon with the
// file signer, for each CA algorithm and both worker generations.
func TestFileBackend(t *testing.T) {
	for _, alg := range []string{"p256", "ed25519"} {
		t.Run(alg, func(t *testing.T) {
			certs := gencreds(t, "-algorithm", alg)
			d := startDaemon(t, "TRUSTD_CERT_DIR="+certs)
			token := strings.TrimSpace(string(readFile(t, filepath.Join(certs, certdir.FileToken))))
			caPEM := readFile(t, filepath.Join(certs, certdir.FileCACert))
			for _, mode := range []struct {
				name string
				m    workerCSR
			}{{"talos-1.10+", csrFromCA}, {"talos-1.9-ed25519", csrEd25519}} {
				t.Run(mode.name, func(t *testing.T) {
					ca, crt, id, err := workerRequest(t, d.Addr, token, caPEM, mode.m, 20*time.Second)
					if err != nil {
						t.Fatalf("worker request: %v\n%s", err, d.Logs())
					}
					checkIssued(t, ca, crt, id, [][]byte{caPEM})
				})
			}
			t.Run("wrong token", func(t *testing.T) {
				_, _, _, err := workerRequest(t, d.Addr, "not-the-token", caPEM, csrFromCA, 3*time.Second)
				if err == nil {
					t.Fatal("a wrong token got a certificate")
				}
				if !strings.Contains(err.Error(), "Unauthenticated") {
					t.Fatalf("wrong token: %v, want Unauthenticated", err)
				}
				if !strings.Contains(d.Logs(), `"outcome":"denied_auth"`) {
					t.Fatalf("no denied_auth audit line\n%s", d.Logs())
				}
				if strings.Contains(d.Logs(), token) || strings.Contains(d.Logs(), "not-the-token") {
					t.Fatal("a token appears in the daemon's log")
				}
			})
		})
	}
}

// TestSelfIssuedServingCert: with no server.crt the daemon issues its own
// serving certificate through the signer and workers accept it.
func TestSelfIssuedServingCert(t *testing.T) {
	certs := gencreds(t)
	// Remove the pre-made serving pair: the daemon must issue its own.
	for _, f := range []string{certdir.FileServerCert, certdir.FileServerKey} {
		if err := removeFile(filepath.Join(certs, f)); err != nil {
			t.Fatal(err)
		}
	}
	d2 := startDaemon(t, "TRUSTD_CERT_DIR="+certs, "TRUSTD_CERT_SANS=trustd.example")
	token := strings.TrimSpace(string(readFile(t, filepath.Join(certs, certdir.FileToken))))
	caPEM := readFile(t, filepath.Join(certs, certdir.FileCACert))
	ca, crt, id, err := workerRequest(t, d2.Addr, token, caPEM, csrFromCA, 20*time.Second)
	if err != nil {
		t.Fatalf("worker request: %v\n%s", err, d2.Logs())
	}
	checkIssued(t, ca, crt, id, [][]byte{caPEM})
	if !strings.Contains(d2.Logs(), "serving certificate issued") {
		t.Fatal("daemon did not self-issue its serving certificate")
	}
}

// TestInlineConfiguration: everything from the environment (base64 PEM
// CA, key, serving pair, token), an empty cert dir, as a Kubernetes
// Deployment without a mounted Secret would run it.
func TestInlineConfiguration(t *testing.T) {
	certs := gencreds(t)
	b64 := func(name string) string {
		return base64.StdEncoding.EncodeToString(readFile(t, filepath.Join(certs, name)))
	}
	token := strings.TrimSpace(string(readFile(t, filepath.Join(certs, certdir.FileToken))))
	d := startDaemon(t,
		"TRUSTD_CERT_DIR="+t.TempDir(),
		"TRUSTD_TOKEN="+token,
		"TRUSTD_OS_CA_CRT="+b64(certdir.FileCACert),
		"TRUSTD_OS_CA_KEY="+b64(certdir.FileCAKey),
		"TRUSTD_SERVER_CRT="+b64(certdir.FileServerCert),
		"TRUSTD_SERVER_KEY="+b64(certdir.FileServerKey),
	)
	caPEM := readFile(t, filepath.Join(certs, certdir.FileCACert))
	ca, crt, id, err := workerRequest(t, d.Addr, token, caPEM, csrFromCA, 20*time.Second)
	if err != nil {
		t.Fatalf("worker request: %v\n%s", err, d.Logs())
	}
	checkIssued(t, ca, crt, id, [][]byte{caPEM})
	if strings.Contains(d.Logs(), token) || strings.Contains(d.Logs(), b64(certdir.FileCAKey)) {
		t.Fatal("a secret from the environment appears in the log")
	}
}

// TestServerCrtLackingCertSANs: gencreds' server.crt (127.0.0.1,
// localhost) wins over TRUSTD_CERT_SANS; the daemon says so at start,
// naming the missing address, instead of letting workers fail TLS.
func TestServerCrtLackingCertSANs(t *testing.T) {
	certs := gencreds(t)
	d := startDaemon(t, "TRUSTD_CERT_DIR="+certs, "TRUSTD_CERT_SANS=203.0.113.10,127.0.0.1")
	eventually(t, 10*time.Second, "the missing-SAN warning", func() bool {
		return strings.Contains(d.Logs(), "does not name these TRUSTD_CERT_SANS entries")
	})
	if logs := d.Logs(); !strings.Contains(logs, "203.0.113.10") || strings.Count(logs, "does not name these TRUSTD_CERT_SANS") != 1 {
		t.Errorf("want one warning naming 203.0.113.10:\n%s", logs)
	}
}
