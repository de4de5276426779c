package server

import (
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/signertest"
)

// countedSigner counts the signatures asked of the CA key.
type countedSigner struct {
	signer.Signer
	calls *signertest.Counting
}

func (s countedSigner) Sign(r io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	return s.calls.Sign(r, d, o)
}

// TestLintRefusalNeverReachesTheSigner: a worker asking for an address
// outside its replica's intermediate's name constraints is refused
// PermissionDenied, denied_lint with the lint's name in the audit line
// and metric, and the CA key is never asked; a good request signs once
// and its lint warning is counted every time but logged once.
func TestLintRefusalNeverReachesTheSigner(t *testing.T) {
	tier := constrainedTier(t, "127.0.0.0/8", "10.0.0.0/8")
	creds, err := LoadCredentials(tier.files(), tier.inter.signer.Public(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	logs := &devtest.LockedBuffer{}
	reg := prometheus.NewRegistry()
	dev := countedSigner{Signer: tier.inter.signer, calls: signertest.NewCounting(tier.inter.signer)}
	svc, err := New(Config{Signer: dev, Credentials: creds, Logger: slog.New(slog.NewJSONHandler(logs, nil)), Metrics: NewMetrics(reg, "file", true)})
	if err != nil {
		t.Fatal(err)
	}
	c := tieredClient(t, svc, tier)
	csr := makeCSR(t, csrSpec{key: newKey(t, "p256"), ips: []net.IP{net.ParseIP("192.168.1.1")}})
	_, err = c.Certificate(withToken(testToken), &securityapi.CertificateRequest{Csr: csr})
	const lint = "e_talos_ip_san_within_name_constraints"
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), lint) {
		t.Fatalf("err = %v, want PermissionDenied naming %s", err, lint)
	}
	if dev.calls.Count() != 0 || !strings.Contains(logs.String(), `"outcome":"denied_lint"`) || !strings.Contains(logs.String(), lint) {
		t.Fatalf("device asked %d times; audit: %s", dev.calls.Count(), logs)
	}
	if n := testutil.ToFloat64(svc.metrics.lint.failures.WithLabelValues(lint)); n != 1 {
		t.Errorf("trustd_lint_failures_total{lint=%q} = %v", lint, n)
	}
	good := makeCSR(t, csrSpec{key: newKey(t, "p256"), ips: []net.IP{net.ParseIP("10.1.2.3")}})
	for range 2 {
		if _, err := c.Certificate(withToken(testToken), &securityapi.CertificateRequest{Csr: good}); err != nil {
			t.Fatal(err)
		}
	}
	const warn = "w_ext_subject_key_identifier_missing_sub_cert"
	if dev.calls.Count() != 2 || strings.Count(logs.String(), "certificate lint warning") != 1 || testutil.ToFloat64(svc.metrics.lint.warnings.WithLabelValues(warn)) != 2 {
		t.Errorf("device asked %d times, warning logged %d times, counted %v", dev.calls.Count(), strings.Count(logs.String(), "certificate lint warning"), testutil.ToFloat64(svc.metrics.lint.warnings.WithLabelValues(warn)))
	}
}

// constrainedTier is a root and an intermediate restricted to ranges.
func constrainedTier(t *testing.T, ranges ...string) *testTier {
	t.Helper()
	root, inter := newTestCA(t, signer.ECDSAP256), newTestCA(t, signer.ECDSAP256)
	var nets []*net.IPNet
	for _, r := range ranges {
		_, n, _ := net.ParseCIDR(r)
		nets = append(nets, n)
	}
	o := pki.IntermediateOptions{Subject: pkix.Name{CommonName: "node-a"}, PermittedIPRanges: nets}
	c, err := pki.NewIntermediateCertificate(root.cert, root.signer, inter.signer.Public(), o, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	inter.cert, inter.pem = c, pki.EncodeCertificates(c)
	return &testTier{root: root, inter: inter}
}

// tieredClient serves svc with a certificate self-issued by the tier's
// intermediate and returns a client trusting the root.
func tieredClient(t *testing.T, svc *Service, tier *testTier) securityapi.SecurityServiceClient {
	t.Helper()
	holder := &CertHolder{}
	si := &SelfIssuer{Holder: holder, Signer: tier.inter.signer, Credentials: svc.Credentials, Hosts: func() ([]string, error) { return []string{"127.0.0.1"}, nil }}
	if err := si.Issue(); err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(tier.root.cert)
	conn, err := grpc.NewClient(serveGRPC(t, svc, holder), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return securityapi.NewSecurityServiceClient(conn)
}
