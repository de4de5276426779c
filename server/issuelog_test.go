package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/steward-trustd/steward-trustd/internal/issuelog"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// TestIssuedCertificatesAreLogged: the certificate a worker receives is
// in the log (inclusion proof under a checkpoint of the log key), and a
// lint refusal is logged as a denial.
func TestIssuedCertificatesAreLogged(t *testing.T) {
	tier := constrainedTier(t, "127.0.0.0/8", "10.0.0.0/8")
	creds, err := LoadCredentials(tier.files(), tier.inter.signer.Public(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	logKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ns, err := issuelog.NewNoteSigner("steward-trustd.test/node-a", logKey)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	l, err := issuelog.Open(dir, issuelog.Options{Signer: ns, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Config{Signer: tier.inter.signer, Credentials: creds, Logger: slog.New(slog.DiscardHandler), IssueLog: l})
	if err != nil {
		t.Fatal(err)
	}
	c := tieredClient(t, svc, tier)
	good := makeCSR(t, csrSpec{key: newKey(t, "p256"), ips: []net.IP{net.ParseIP("10.1.2.3")}})
	resp, err := c.Certificate(withToken(testToken), &securityapi.CertificateRequest{Csr: good})
	if err != nil {
		t.Fatal(err)
	}
	bad := makeCSR(t, csrSpec{key: newKey(t, "p256"), ips: []net.IP{net.ParseIP("192.168.1.1")}})
	if _, err := c.Certificate(withToken(testToken), &securityapi.CertificateRequest{Csr: bad}); status.Code(err) != codes.PermissionDenied {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	snap, err := issuelog.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	report, err := issuelog.Verify(snap, ns.Verifier())
	if err != nil || !report.OK() || report.Entries != 2 || report.Issued != 1 {
		t.Fatalf("%v %+v", err, report)
	}
	leaf, err := pki.ParseCertificates(resp.GetCrt())
	if err != nil {
		t.Fatal(err)
	}
	idx, _, err := issuelog.Find(snap, leaf[0].Raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := issuelog.Prove(snap, idx, report.Latest); err != nil {
		t.Fatal(err)
	}
	denied, _ := issuelog.ParseEntry(snap.Entries[1])
	if denied.Event != issuelog.EventDenied || denied.Outcome != "denied_lint" || !strings.Contains(denied.Reason, "e_talos_ip_san_within_name_constraints") {
		t.Errorf("denial entry %+v", denied)
	}
}

// failingLog refuses every append, as a full disk does.
type failingLog struct{}

func (failingLog) Append(context.Context, []byte) (int64, error) {
	return 0, errors.New("no space left on device")
}

// TestLogFailureIsUnavailable: a certificate the log cannot hold is not
// sent: Unavailable, outcome log_error.
func TestLogFailureIsUnavailable(t *testing.T) {
	ca := newTestCA(t, signer.ECDSAP256)
	logs := &strings.Builder{}
	svc, err := New(Config{Signer: ca.signer, Credentials: ca.credentials(t, testToken), Logger: slog.New(slog.NewJSONHandler(logs, nil)), IssueLog: failingLog{},
		RateLimits: RateLimits{PerPeerRate: -1}})
	if err != nil {
		t.Fatal(err)
	}
	req := &securityapi.CertificateRequest{Csr: makeCSR(t, csrSpec{key: newKey(t, "p256"), dns: []string{"w"}})}
	resp, err := svc.Certificate(ctxFrom("10.0.0.1"), req)
	if status.Code(err) != codes.Unavailable || resp != nil || !strings.Contains(logs.String(), `"outcome":"log_error"`) {
		t.Fatalf("resp %v err %v; audit %s", resp, err, logs)
	}
}
