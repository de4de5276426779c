package server

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

const testToken = "0123456789abcdef-secret-token"

// failingSigner wraps a signer and fails with err while err is set.
type failingSigner struct {
	signer.Signer
	mu    sync.Mutex
	err   error
	panic bool // panic in Sign, like a buggy backend
}

func (f *failingSigner) setErr(err error) { f.mu.Lock(); f.err = err; f.mu.Unlock() }
func (f *failingSigner) setPanic(p bool)  { f.mu.Lock(); f.panic = p; f.mu.Unlock() }

func (f *failingSigner) Sign(r io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	f.mu.Lock()
	err, p := f.err, f.panic
	f.mu.Unlock()
	if p {
		panic("bug in a backend")
	}
	if err != nil {
		return nil, err
	}
	return f.Signer.Sign(r, d, o)
}

type testServer struct {
	addr   string
	ca     *testCA
	svc    *Service
	logs   *devtest.LockedBuffer
	roots  *x509.CertPool
	signer *failingSigner
}

func startServer(t *testing.T, policy Policy) *testServer {
	t.Helper()
	ca := newTestCA(t, signer.ECDSAP256)
	logs := &devtest.LockedBuffer{}
	fs := &failingSigner{Signer: ca.signer}
	svc, err := New(Config{
		Signer:      fs,
		Credentials: ca.credentials(t, testToken),
		Policy:      policy,
		Logger:      slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	holder := &CertHolder{}
	si := &SelfIssuer{Holder: holder, Signer: ca.signer, CA: func() *x509.Certificate { return ca.cert },
		Hosts: func() ([]string, error) { return []string{"127.0.0.1", "localhost"}, nil }}
	if err := si.Issue(); err != nil {
		t.Fatal(err)
	}
	addr := serveGRPC(t, svc, holder)
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	return &testServer{addr: addr, ca: ca, svc: svc, logs: logs, roots: roots, signer: fs}
}

func (ts *testServer) client(t *testing.T) securityapi.SecurityServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(ts.addr, grpc.WithDefaultCallOptions(grpc.WaitForReady(false)), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ts.roots, ServerName: "127.0.0.1"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return securityapi.NewSecurityServiceClient(conn)
}

func withToken(tok string) context.Context {
	ctx := context.Background()
	if tok == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "token", tok)
}

func TestCertificateRPC(t *testing.T) {
	ts := startServer(t, Policy{})
	c := ts.client(t)
	csr := makeCSR(t, csrSpec{key: newKey(t, "ed25519"), dns: []string{"worker"}, ips: []net.IP{net.ParseIP("127.0.0.1")}})

	resp, err := c.Certificate(withToken(testToken), &securityapi.CertificateRequest{Csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(resp.Ca, ts.ca.pem) {
		t.Errorf("ca bundle %q, want the OS CA", resp.Ca)
	}
	block, _ := pem.Decode(resp.Crt)
	if block == nil {
		t.Fatal("crt is not PEM")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(resp.Ca) {
		t.Fatal("ca not parseable")
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "worker"}); err != nil {
		t.Fatal(err)
	}

	errCases := []struct {
		name  string
		token string
		csr   []byte
		code  codes.Code
	}{
		{"no token", "", csr, codes.Unauthenticated},
		{"wrong token", "wrong", csr, codes.Unauthenticated},
		{"token prefix", testToken[:10], csr, codes.Unauthenticated},
		{"bad csr", testToken, []byte("nope"), codes.InvalidArgument},
		{"oversized", testToken, make([]byte, 70<<10), codes.ResourceExhausted}, // refused by gRPC's size limit
	}
	for _, ec := range errCases {
		t.Run(ec.name, func(t *testing.T) {
			_, err := c.Certificate(withToken(ec.token), &securityapi.CertificateRequest{Csr: ec.csr})
			if status.Code(err) != ec.code {
				t.Fatalf("code %v (%v), want %v", status.Code(err), err, ec.code)
			}
		})
	}
	if strings.Contains(ts.logs.String(), testToken[:10]) {
		t.Fatal("token (or a prefix) appears in the logs")
	}
	// One audit line per decision, with the fields the operator needs.
	var issued map[string]any
	for _, line := range strings.Split(strings.TrimSpace(ts.logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		if m["event"] == "certificate_request" && m["outcome"] == "issued" {
			issued = m
		}
	}
	if issued == nil {
		t.Fatal("no audit line for the issued certificate")
	}
	for _, k := range []string{"peer", "subject", "sans", "serial", "not_after", "csr_sha256"} {
		if _, ok := issued[k]; !ok {
			t.Errorf("audit line lacks %q: %v", k, issued)
		}
	}
	if got := strings.Count(ts.logs.String(), `"outcome":"denied_auth"`); got != 3 {
		t.Errorf("%d denied_auth audit lines, want 3", got)
	}
}

func TestPlaintextRefused(t *testing.T) {
	ts := startServer(t, Policy{})
	conn, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = securityapi.NewSecurityServiceClient(conn).Certificate(withToken(testToken), &securityapi.CertificateRequest{Csr: []byte("x")})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext call: %v, want a transport failure", err)
	}
}

func TestSignerFailureIsUnavailable(t *testing.T) {
	ts := startServer(t, Policy{})
	c := ts.client(t)
	csr := makeCSR(t, csrSpec{key: newKey(t, "p256"), dns: []string{"w"}})
	devErr := errors.New("device said no: secret-detail-42")
	ts.signer.setErr(errors.Join(signer.ErrPolicyNotSatisfied, devErr))
	for i := 0; i < 3; i++ {
		_, err := c.Certificate(withToken(testToken), &securityapi.CertificateRequest{Csr: csr})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("code %v, want Unavailable", status.Code(err))
		}
		if strings.Contains(err.Error(), "secret-detail-42") {
			t.Fatal("device detail leaked to the client")
		}
	}
	if n := strings.Count(ts.logs.String(), `"msg":"signer failing"`); n != 1 {
		t.Fatalf("signer failure logged %d times, want once per state change", n)
	}
	ts.signer.setErr(nil)
	if _, err := c.Certificate(withToken(testToken), &securityapi.CertificateRequest{Csr: csr}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ts.logs.String(), "signer recovered") {
		t.Fatal("recovery not logged")
	}
}

func TestPolicyDenied(t *testing.T) {
	ts := startServer(t, Policy{RequirePeerIP: true})
	c := ts.client(t)
	csr := makeCSR(t, csrSpec{key: newKey(t, "p256"), ips: []net.IP{net.ParseIP("10.9.9.9")}})
	_, err := c.Certificate(withToken(testToken), &securityapi.CertificateRequest{Csr: csr})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("code %v, want PermissionDenied", status.Code(err))
	}
	csr = makeCSR(t, csrSpec{key: newKey(t, "p256"), ips: []net.IP{net.ParseIP("127.0.0.1")}})
	if _, err := c.Certificate(withToken(testToken), &securityapi.CertificateRequest{Csr: csr}); err != nil {
		t.Fatal(err)
	}
}

func TestAcceptedCAsBundle(t *testing.T) {
	ca := newTestCA(t, signer.ECDSAP256)
	old := newTestCA(t, signer.ECDSAP256)
	files := CredentialFiles{Token: []byte(testToken + "\n"), CACert: ca.pem, AcceptedCAs: append(old.pem, ca.pem...), TrustStatement: ca.vouch(t, 1, old)}
	creds, err := LoadCredentials(files, ca.signer.Public(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got := bytes.Count(creds.Bundle(), []byte("BEGIN CERTIFICATE")); got != 2 {
		t.Fatalf("bundle has %d certificates, want 2 (duplicate dropped)", got)
	}
	if creds.Tokens() != 1 || creds.tokens.match([]byte(testToken)) != 0 {
		t.Fatal("token not trimmed")
	}
	leafKey := newKey(t, "p256")
	leaf, err := pki.NewServingCertificate(ca.cert, ca.signer, leafKey.Public(), []string{"x"}, time.Hour, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw})
	bad := []struct {
		name             string
		token, ca, extra []byte
		want             string
	}{
		{"empty token", []byte(" \n"), ca.pem, nil, "token"},
		{"no ca", []byte("t"), nil, nil, "no PEM CERTIFICATE"},
		{"two cas", []byte("t"), append(ca.pem, old.pem...), nil, "exactly one"},
		{"leaf as ca", []byte("t"), leafPEM, nil, "not a CA"},
		{"leaf in accepted", []byte("t"), ca.pem, leafPEM, "not a CA"},
		{"garbage accepted", []byte("t"), ca.pem, []byte("junk"), "no PEM CERTIFICATE"},
		{"truncated accepted", []byte("t"), ca.pem, append(old.pem, ca.pem[:len(ca.pem)/2]...), "truncated"},
		{"key mismatch", []byte("t"), old.pem, nil, "does not match"},
	}
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			_, err := NewCredentials(b.token, b.ca, b.extra, ca.signer.Public())
			if err == nil || !strings.Contains(err.Error(), b.want) {
				t.Fatalf("err %v, want %q", err, b.want)
			}
		})
	}
}

func FuzzCertificate(f *testing.F) {
	ca := newTestCA(f, signer.ECDSAP256)
	svc, err := New(Config{Signer: ca.signer, Credentials: ca.credentials(f, testToken)})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(makeCSR(f, csrSpec{key: newKey(f, "p256"), dns: []string{"a"}}))
	f.Add(makeCSR(f, csrSpec{key: newKey(f, "ed25519"), ips: []net.IP{net.IPv4(10, 0, 0, 1)}}))
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nMAA=\n-----END CERTIFICATE REQUEST-----\n"))
	f.Add([]byte{})
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("token", testToken))
	f.Fuzz(func(t *testing.T, csr []byte) {
		resp, err := svc.Certificate(ctx, &securityapi.CertificateRequest{Csr: csr})
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument {
				t.Fatalf("unexpected code %v: %v", c, err)
			}
			return
		}
		block, _ := pem.Decode(resp.Crt)
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if cert.IsCA || len(cert.ExtKeyUsage) != 1 || cert.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth || len(cert.Subject.Organization) != 0 {
			t.Fatalf("issued certificate breaks the profile: CA=%v EKU=%v O=%v", cert.IsCA, cert.ExtKeyUsage, cert.Subject.Organization)
		}
	})
}
