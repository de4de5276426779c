package server

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/steward-trustd/steward-trustd/internal/authz"
	"github.com/steward-trustd/steward-trustd/internal/inventory"
	"github.com/steward-trustd/steward-trustd/signer"
)

const testInventory = `{"apiVersion":"` + inventory.FileVersion + `","machines":[
 {"name":"w1","addresses":["10.0.0.1"]},
 {"name":"w2","addresses":["10.0.0.2"]}]}`

// authzService is a service with an authorizer whose audit lines are
// collected.
type authzService struct {
	svc   *Service
	audit *bytes.Buffer
	ca    *testCA
}

func newAuthzService(t *testing.T, d Decider, mode AuthorizerMode) *authzService {
	t.Helper()
	a, err := NewAuthorizer(AuthorizerConfig{Decider: d, Mode: mode, CacheTTL: -1, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ca := newTestCA(t, signer.ECDSAP256)
	buf := &bytes.Buffer{}
	svc, err := New(Config{Signer: ca.signer, Credentials: ca.credentials(t, testToken), Audit: slogJSON(buf), RateLimits: RateLimits{PerPeerRate: -1}, Authorizer: a})
	if err != nil {
		t.Fatal(err)
	}
	return &authzService{svc: svc, audit: buf, ca: ca}
}

func newFileDecider(t *testing.T, inv string) *FileDecider {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "inventory.json")
	if err := os.WriteFile(path, []byte(inv), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := NewFileDecider(path, filepath.Join(dir, "state.json"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// request asks from peer for the SANs; it returns the code and the last
// audit line.
func (s *authzService) request(t *testing.T, peer string, dns []string, ips ...string) (codes.Code, map[string]any) {
	t.Helper()
	s.audit.Reset()
	spec := csrSpec{key: newKey(t, "p256"), dns: dns}
	for _, ip := range ips {
		spec.ips = append(spec.ips, net.ParseIP(ip))
	}
	_, err := s.svc.Certificate(ctxFrom(peer), &securityapi.CertificateRequest{Csr: makeCSR(t, spec)})
	var line map[string]any
	if jerr := json.Unmarshal(s.audit.Bytes(), &line); jerr != nil {
		t.Fatalf("audit line %q: %v", s.audit.String(), jerr)
	}
	return status.Code(err), line
}

func TestAuthorizerFileEnforce(t *testing.T) {
	s := newAuthzService(t, newFileDecider(t, testInventory), AuthorizerEnforce)
	cases := []struct {
		name, peer string
		dns        []string
		ips        []string
		code       codes.Code
		outcome    string
	}{
		{"own address and name", "10.0.0.1", []string{"w1"}, []string{"10.0.0.1", "127.0.0.1", "::1"}, codes.OK, "issued"},
		{"unknown address", "10.0.0.9", []string{"w1"}, []string{"10.0.0.9"}, codes.PermissionDenied, authz.OutcomeUnknownMachine},
		{"another machine's address", "10.0.0.1", []string{"w1"}, []string{"10.0.0.2"}, codes.PermissionDenied, authz.OutcomeAddressNotOwned},
		{"pinned address asks for another name", "10.0.0.1", []string{"w2"}, []string{"10.0.0.1"}, codes.PermissionDenied, authz.OutcomePinned},
		{"another machine's name, unpinned", "10.0.0.2", []string{"w1"}, []string{"10.0.0.2"}, codes.PermissionDenied, authz.OutcomeNameNotOwned},
	}
	for _, c := range cases {
		code, line := s.request(t, c.peer, c.dns, c.ips...)
		if code != c.code || line["outcome"] != c.outcome {
			t.Errorf("%s: got %v, audit %v; want %v, outcome %s", c.name, code, line, c.code, c.outcome)
		}
	}
}

func TestAuthorizerObserve(t *testing.T) {
	s := newAuthzService(t, newFileDecider(t, testInventory), AuthorizerObserve)
	code, line := s.request(t, "10.0.0.9", []string{"w1"}, "10.0.0.9")
	if code != codes.OK || line["outcome"] != "issued" || line["authorizer"] != authz.OutcomeWouldDeny || !strings.Contains(line["authorizer_reason"].(string), authz.OutcomeUnknownMachine) {
		t.Fatalf("observe mode: %v %v", code, line)
	}
}

// stubDecider answers with resp or err, counting calls.
type stubDecider struct {
	calls atomic.Int32
	resp  atomic.Pointer[authz.Response]
	err   atomic.Pointer[error]
}

func (d *stubDecider) Describe() string { return "stub" }

func (d *stubDecider) Decide(context.Context, *authz.Request) (*authz.Response, error) {
	d.calls.Add(1)
	if e := d.err.Load(); e != nil {
		return nil, *e
	}
	return d.resp.Load(), nil
}

func TestAuthorizerUnavailableAndReadiness(t *testing.T) {
	d := &stubDecider{}
	down := error(&badResponseError{err: os.ErrClosed})
	d.err.Store(&down)
	logBuf := &bytes.Buffer{}
	a, err := NewAuthorizer(AuthorizerConfig{Decider: d, Log: slogJSON(logBuf), CacheTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	ca := newTestCA(t, signer.ECDSAP256)
	svc, err := New(Config{Signer: ca.signer, Credentials: ca.credentials(t, testToken), RateLimits: RateLimits{PerPeerRate: -1}, Authorizer: a})
	if err != nil {
		t.Fatal(err)
	}
	req := &securityapi.CertificateRequest{Csr: makeCSR(t, csrSpec{key: newKey(t, "p256"), dns: []string{"w1"}})}
	for range 3 {
		if _, err := svc.Certificate(ctxFrom("10.0.0.1"), req); status.Code(err) != codes.Unavailable {
			t.Fatalf("authorizer down: got %v, want Unavailable", err)
		}
	}
	if a.Ready() == nil {
		t.Fatal("ready while the authorizer fails in enforce mode")
	}
	// Back: the readiness probe finds out without any worker's request
	// (a not-ready daemon gets none).
	d.err.Store(nil)
	d.resp.Store(&authz.Response{APIVersion: authz.APIVersion, Outcome: authz.OutcomeUnknownMachine})
	deadline := time.Now().Add(10 * time.Second)
	for a.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the probe did not find the authorizer back")
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.resp.Store(&authz.Response{APIVersion: authz.APIVersion, Allow: true, Outcome: authz.OutcomeAllowed})
	if _, err := svc.Certificate(ctxFrom("10.0.0.1"), req); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logBuf.String(), "\n"); n != 2 {
		t.Fatalf("want one line for the failure and one for the recovery, got %d:\n%s", n, logBuf)
	}
}

func TestAuthorizerCache(t *testing.T) {
	d := &stubDecider{}
	d.resp.Store(&authz.Response{APIVersion: authz.APIVersion, Allow: true, Outcome: authz.OutcomeAllowed})
	now := time.Unix(1e9, 0)
	a, err := NewAuthorizer(AuthorizerConfig{Decider: d, CacheTTL: time.Second, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	r := &Request{Requested: []string{"w1"}}
	check := func(peer string) error {
		return a.check(context.Background(), r, addr(peer), 0, "", &authzRecord{})
	}
	for _, step := range []struct {
		peer  string
		after time.Duration
		calls int32
	}{{"10.0.0.1", 0, 1}, {"10.0.0.1", 0, 1}, {"10.0.0.2", 0, 2}, {"10.0.0.1", 2 * time.Second, 3}} {
		now = now.Add(step.after)
		if err := check(step.peer); err != nil {
			t.Fatal(err)
		}
		if got := d.calls.Load(); got != step.calls {
			t.Fatalf("%s after %v: %d calls, want %d", step.peer, step.after, got, step.calls)
		}
	}
	d.resp.Store(&authz.Response{APIVersion: authz.APIVersion, Outcome: authz.OutcomePinned})
	for range 2 {
		if err := check("10.0.0.3"); err == nil {
			t.Fatal("denial allowed")
		}
	}
	if got := d.calls.Load(); got != 5 {
		t.Fatalf("denials were cached: %d calls", got)
	}
}

func TestParseAuthorizerTarget(t *testing.T) {
	for in, kind := range map[string]string{"": "none", "none": "none", "file:/etc/inv.json": "file", "https://authz.example/v1/decide": "webhook", "unix:///run/a.sock": "webhook",
		"http://authz.example": "", "file:inv.json": "", "unix://run/a.sock": "", "tcp://x": ""} {
		got, err := ParseAuthorizerTarget(in)
		if got.Kind != kind || (kind == "") != (err != nil) {
			t.Errorf("%q: got %+v, %v; want kind %q", in, got, err, kind)
		}
	}
	for in, ok := range map[string]bool{"": true, "enforce": true, "observe": true, "audit": false} {
		if _, err := ParseAuthorizerMode(in); (err == nil) != ok {
			t.Errorf("mode %q: %v", in, err)
		}
	}
}

func slogJSON(buf *bytes.Buffer) *slog.Logger { return slog.New(slog.NewJSONHandler(buf, nil)) }
