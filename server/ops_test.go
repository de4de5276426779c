package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/signer"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time        { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration)   { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }
func newFakeClock() *fakeClock             { return &fakeClock{t: time.Now()} }
func addr(s string) netip.Addr             { return netip.MustParseAddr(s) }
func isLimit(err error) bool               { var l *limitError; return errors.As(err, &l) }
func ctxFrom(ip string) context.Context    { return peerCtx(ip, testToken) }
func badCtxFrom(ip string) context.Context { return peerCtx(ip, "wrong") }

func peerCtx(ip, token string) context.Context {
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}})
	return metadata.NewIncomingContext(ctx, metadata.Pairs("token", token))
}

func TestPerPeerRateLimit(t *testing.T) {
	clk := newFakeClock()
	l := newLimiter(RateLimits{PerPeerRate: 1, PerPeerBurst: 3}, clk.now)
	a, b := addr("10.0.0.1"), addr("10.0.0.2")
	for i := 0; i < 3; i++ {
		if err := l.admit(a); err != nil {
			t.Fatalf("request %d within burst refused: %v", i, err)
		}
	}
	if err := l.admit(a); !isLimit(err) {
		t.Fatalf("request past burst: %v, want a limit error", err)
	}
	if err := l.admit(b); err != nil {
		t.Fatalf("another address is limited too: %v", err)
	}
	if err := l.admit(addr("::ffff:10.0.0.1")); !isLimit(err) {
		t.Fatal("a v4-mapped address escapes its v4 bucket")
	}
	clk.add(time.Second)
	if err := l.admit(a); err != nil {
		t.Fatalf("after refill: %v", err)
	}
	off := newLimiter(RateLimits{PerPeerRate: -1}, clk.now)
	for i := 0; i < 1000; i++ {
		if err := off.admit(a); err != nil {
			t.Fatal("disabled limit refused a request")
		}
	}
}

func TestBadTokenSlowdown(t *testing.T) {
	csrOf := func(t *testing.T) *securityapi.CertificateRequest {
		return &securityapi.CertificateRequest{Csr: makeCSR(t, csrSpec{key: newKey(t, "p256"), dns: []string{"w"}})}
	}
	cases := []struct {
		name       string
		limits     RateLimits
		wrong      int          // wrong tokens sent first from 10.1.1.1
		wantWrong  []codes.Code // answers to a further wrong token, then after 10 s
		rightAfter bool         // the right token from the same address still works at once
	}{
		{"slowed down after the burst", RateLimits{BadTokenBurst: 3, BadTokenRate: 0.1, PerPeerBurst: 100}, 3,
			[]codes.Code{codes.ResourceExhausted, codes.Unauthenticated}, true},
		{"disabled with -1", RateLimits{BadTokenBurst: 3, BadTokenRate: -1, PerPeerBurst: 100}, 50,
			[]codes.Code{codes.Unauthenticated, codes.Unauthenticated}, true},
		// Wrong tokens never use the address's request budget.
		{"request budget untouched", RateLimits{BadTokenBurst: 100, BadTokenRate: 0.1, PerPeerBurst: 2, PerPeerRate: 0.001}, 20,
			[]codes.Code{codes.Unauthenticated, codes.Unauthenticated}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			ca := newTestCA(t, signer.ECDSAP256)
			svc, err := New(Config{Signer: ca.signer, Credentials: ca.credentials(t, testToken), Clock: clk.now, RateLimits: tc.limits})
			if err != nil {
				t.Fatal(err)
			}
			req := csrOf(t)
			for i := 0; i < tc.wrong; i++ {
				if _, err := svc.Certificate(badCtxFrom("10.1.1.1"), req); status.Code(err) != codes.Unauthenticated {
					t.Fatalf("wrong token %d: %v", i, err)
				}
			}
			if _, err := svc.Certificate(ctxFrom("10.1.1.1"), req); (err == nil) != tc.rightAfter {
				t.Fatalf("right token from the same address after wrong ones: %v", err)
			}
			if _, err := svc.Certificate(badCtxFrom("10.1.1.1"), req); status.Code(err) != tc.wantWrong[0] {
				t.Fatalf("further wrong token: %v, want %v", err, tc.wantWrong[0])
			}
			if _, err := svc.Certificate(badCtxFrom("10.1.1.2"), req); status.Code(err) != codes.Unauthenticated {
				t.Fatalf("another address is slowed down too: %v", err)
			}
			clk.add(10 * time.Second)
			if _, err := svc.Certificate(badCtxFrom("10.1.1.1"), req); status.Code(err) != tc.wantWrong[1] {
				t.Fatalf("wrong token after 10 s: %v, want %v", err, tc.wantWrong[1])
			}
			if _, err := svc.Certificate(ctxFrom("10.1.1.1"), req); err != nil {
				t.Fatalf("right token at the end: %v", err)
			}
		})
	}
}

func TestMetricsLabels(t *testing.T) {
	ca := newTestCA(t, signer.ECDSAP256)
	fs := &failingSigner{Signer: ca.signer}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "tpm", false)
	svc, err := New(Config{Signer: fs, Credentials: ca.credentials(t, testToken), Metrics: m, RateLimits: RateLimits{PerPeerRate: -1}})
	if err != nil {
		t.Fatal(err)
	}
	good := &securityapi.CertificateRequest{Csr: makeCSR(t, csrSpec{key: newKey(t, "p256"), dns: []string{"w"}})}
	svc.Certificate(ctxFrom("10.0.0.1"), good)
	svc.Certificate(badCtxFrom("10.0.0.1"), good)
	svc.Certificate(ctxFrom("10.0.0.1"), &securityapi.CertificateRequest{Csr: []byte("x")})
	fs.setErr(errors.Join(signer.ErrPolicyNotSatisfied, errors.New("rc")))
	svc.Certificate(ctxFrom("10.0.0.1"), good)
	fs.setErr(errors.Join(signer.ErrDeviceUnavailable, errors.New("eof")))
	svc.Certificate(ctxFrom("10.0.0.1"), good)

	checks := []struct {
		c    prometheus.Collector
		want float64
	}{
		{m.issued, 1},
		{m.denied.WithLabelValues("auth"), 1},
		{m.denied.WithLabelValues("bad_csr"), 1},
		{m.denied.WithLabelValues("signer"), 2},
		{m.signerErrors.WithLabelValues("tpm", "policy"), 1},
		{m.signerErrors.WithLabelValues("tpm", "device"), 1},
		{m.signerInfo.WithLabelValues("tpm", "false"), 1},
	}
	for i, c := range checks {
		if got := testutil.ToFloat64(c.c); got != c.want {
			t.Errorf("check %d: %v, want %v", i, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.signerLatency, "trustd_signer_duration_seconds"); n != 1 {
		t.Errorf("latency histogram series %d, want 1 (backend=tpm)", n)
	}
	if exp := testutil.ToFloat64(m.caExpiry); exp < 9*365*24*3600 {
		t.Errorf("CA expiry gauge %v", exp)
	}
	names := map[string]bool{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"trustd_certificates_issued_total", "trustd_requests_denied_total", "trustd_signer_duration_seconds",
		"trustd_signer_errors_total", "trustd_os_ca_expiry_seconds", "trustd_signer_info", "trustd_signer_ready"} {
		if !names[n] {
			t.Errorf("metric %s not exported", n)
		}
	}
}

func TestReadinessAndHealthEndpoints(t *testing.T) {
	ca := newTestCA(t, signer.ECDSAP256)
	fs := &failingSigner{Signer: ca.signer}
	clk := newFakeClock()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "file", true)
	r := NewReadiness(fs, 30*time.Second, clk.now, m)
	srv := httptest.NewUnstartedServer(HealthHandler(r, reg))
	srv.EnableHTTP2 = true
	srv.Start()
	defer srv.Close()
	get := func(path string) int {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := get("/healthz"); c != 200 {
		t.Fatalf("/healthz %d", c)
	}
	if c := get("/readyz"); c != 200 {
		t.Fatalf("/readyz %d with a working signer", c)
	}
	fs.setErr(errors.Join(signer.ErrDeviceUnavailable, errors.New("gone")))
	// A failed request signature flips readiness at once.
	r.Observe(errors.New("sign failed"))
	if c := get("/readyz"); c != 503 {
		t.Fatalf("/readyz %d after a failed signature, want 503", c)
	}
	// No request traffic: the next probe happens only after window/2.
	clk.add(20 * time.Second)
	if c := get("/readyz"); c != 503 {
		t.Fatalf("/readyz %d with the device gone", c)
	}
	// The failed probe counts like a request's signer error.
	if got := testutil.ToFloat64(m.signerErrors.WithLabelValues("file", "device")); got != 1 {
		t.Fatalf("trustd_signer_errors_total{kind=device} %v after a failed probe, want 1", got)
	}
	fs.setErr(nil)
	clk.add(20 * time.Second)
	if c := get("/readyz"); c != 200 {
		t.Fatalf("/readyz %d after the device came back", c)
	}
	if testutil.ToFloat64(m.ready) != 1 {
		t.Fatal("ready gauge not 1")
	}
	if c := get("/metrics"); c != 200 {
		t.Fatalf("/metrics %d", c)
	}
	// gRPC health over cleartext HTTP/2 on the same address.
	hs := NewHealthServer("127.0.0.1:0", HealthHandler(r, reg))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve(ln)
	defer hs.Close()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "securityapi.SecurityService"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health %v", resp.Status)
	}
	r.Observe(errors.New("down"))
	resp, err = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("gRPC health after failure: %v %v", resp, err)
	}
	hresp, err := http.Get("http://" + ln.Addr().String() + "/healthz")
	if err != nil || hresp.StatusCode != 200 {
		t.Fatalf("HTTP/1.1 /healthz on the health server: %v", err)
	}
	hresp.Body.Close()
}

func writeCertDir(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReload(t *testing.T) {
	ca := newTestCA(t, signer.ECDSAP256)
	other := newTestCA(t, signer.ECDSAP256)
	// Kubernetes layout: files are symlinks into ..data, which is swapped.
	root := t.TempDir()
	mkgen := func(name string, files map[string][]byte) {
		d := filepath.Join(root, name)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		writeCertDir(t, d, files)
		tmp := filepath.Join(root, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(root, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	mkgen("gen1", map[string][]byte{certdir.FileToken: []byte(testToken), certdir.FileCACert: ca.pem})
	for _, f := range []string{certdir.FileToken, certdir.FileCACert, certdir.FileAcceptedCAs, certdir.FileTrustStatement} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(root, f)); err != nil {
			t.Fatal(err)
		}
	}
	dir := CertDir{Dir: root, SignerPublic: ca.signer.Public()}
	creds, d, err := dir.Credentials()
	if err != nil {
		t.Fatal(err)
	}
	var logs devtest.LockedBuffer
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "file", true)
	svc, err := New(Config{Signer: ca.signer, Credentials: creds, Metrics: m, RateLimits: RateLimits{PerPeerRate: -1}})
	if err != nil {
		t.Fatal(err)
	}
	// Forced: this test swaps whole token sets (TestTokenReloadGuard
	// covers the refusal).
	rl := &Reloader{Dir: dir, Service: svc, Metrics: m, Logger: slog.New(slog.NewJSONHandler(&logs, nil)), ForceTokenReplace: true}
	rl.Prime(d, Digest{})
	req := &securityapi.CertificateRequest{Csr: makeCSR(t, csrSpec{key: newKey(t, "p256"), dns: []string{"w"}})}
	tokenCtx := func(tok string) context.Context { return peerCtx("10.0.0.1", tok) }

	rl.Check()
	if testutil.ToFloat64(m.reloads.WithLabelValues("credentials", "ok")) != 0 {
		t.Fatal("reloaded without a change")
	}
	// A new token and an accepted CA: swapped in without a restart.
	mkgen("gen2", map[string][]byte{certdir.FileToken: []byte("new-token"), certdir.FileCACert: ca.pem, certdir.FileAcceptedCAs: other.pem, certdir.FileTrustStatement: ca.vouch(t, 1, other)})
	rl.Check()
	if _, err := svc.Certificate(tokenCtx(testToken), req); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("old token after reload: %v", err)
	}
	resp, err := svc.Certificate(tokenCtx("new-token"), req)
	if err != nil {
		t.Fatalf("new token after reload: %v", err)
	}
	if n := strings.Count(string(resp.Ca), "BEGIN CERTIFICATE"); n != 2 {
		t.Fatalf("bundle has %d CAs after adding accepted-cas.crt, want 2", n)
	}
	// A broken CA (does not match the signer) is refused; the old set stays.
	mkgen("gen3", map[string][]byte{certdir.FileToken: []byte("third-token"), certdir.FileCACert: other.pem})
	rl.Check()
	rl.Check()
	if _, err := svc.Certificate(tokenCtx("new-token"), req); err != nil {
		t.Fatalf("running credentials lost after a broken reload: %v", err)
	}
	if got := testutil.ToFloat64(m.reloads.WithLabelValues("credentials", "error")); got != 1 {
		t.Fatalf("reload errors %v, want 1 (reported once per broken content)", got)
	}
	if !strings.Contains(logs.String(), "reload refused") {
		t.Fatal("broken reload not logged")
	}
	if !strings.Contains(logs.String(), "after `rotate --finish`") {
		t.Fatalf("a CA that no longer matches the signer is logged without the rotation hint: %s", logs.String())
	}
	// Fixed content is picked up.
	mkgen("gen4", map[string][]byte{certdir.FileToken: []byte("third-token"), certdir.FileCACert: ca.pem})
	rl.Check()
	if _, err := svc.Certificate(tokenCtx("third-token"), req); err != nil {
		t.Fatalf("after a good reload: %v", err)
	}
	if got := testutil.ToFloat64(m.reloads.WithLabelValues("credentials", "ok")); got != 2 {
		t.Fatalf("successful reloads %v, want 2", got)
	}
	wantReloadFailed(t, m, 0, "after a good reload")
	// Broken again, then the running files put back: the alert's gauge
	// stays 1 while the refused set is there and clears without a reload.
	mkgen("gen5", map[string][]byte{certdir.FileToken: []byte("fourth-token"), certdir.FileCACert: other.pem})
	rl.Check()
	wantReloadFailed(t, m, 1, "with a refused set in the dir")
	mkgen("gen6", map[string][]byte{certdir.FileToken: []byte("third-token"), certdir.FileCACert: ca.pem})
	rl.Check()
	wantReloadFailed(t, m, 0, "with the running files back")
	if got := testutil.ToFloat64(m.reloads.WithLabelValues("credentials", "ok")); got != 2 {
		t.Fatalf("successful reloads %v after the files came back, want 2 (nothing to reload)", got)
	}
}

// wantReloadFailed checks trustd_reload_failed{what="credentials"}.
func wantReloadFailed(t *testing.T, m *Metrics, want float64, when string) {
	t.Helper()
	if got := testutil.ToFloat64(m.reloadFailed.WithLabelValues("credentials")); got != want {
		t.Fatalf("trustd_reload_failed %v %s, want %v", got, when, want)
	}
}

func TestReloadServingCert(t *testing.T) {
	ca := newTestCA(t, signer.ECDSAP256)
	dir := t.TempDir()
	issue := func(host string) (crt, key []byte) {
		holder := &CertHolder{}
		si := &SelfIssuer{Holder: holder, Signer: ca.signer, CA: func() *x509Cert { return ca.cert }, Hosts: func() ([]string, error) { return []string{host}, nil }}
		if err := si.Issue(); err != nil {
			t.Fatal(err)
		}
		return pemCert(holder.Get()), pemKey(t, holder.Get())
	}
	crt, key := issue("one.example")
	writeCertDir(t, dir, map[string][]byte{certdir.FileToken: []byte(testToken), certdir.FileCACert: ca.pem, certdir.FileServerCert: crt, certdir.FileServerKey: key})
	cd := CertDir{Dir: dir, SignerPublic: ca.signer.Public()}
	creds, d1, err := cd.Credentials()
	if err != nil {
		t.Fatal(err)
	}
	c, d2, err := cd.ServingCert(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	holder := &CertHolder{}
	holder.Set(c)
	svc, _ := New(Config{Signer: ca.signer, Credentials: creds})
	rl := &Reloader{Dir: cd, Service: svc, Holder: holder}
	rl.Prime(d1, d2)
	crt2, key2 := issue("two.example")
	writeCertDir(t, dir, map[string][]byte{certdir.FileServerCert: crt2})
	rl.Check() // key and certificate do not match yet: refused
	if holder.Get().Leaf.DNSNames[0] != "one.example" {
		t.Fatal("mismatched pair installed")
	}
	writeCertDir(t, dir, map[string][]byte{certdir.FileServerKey: key2})
	rl.Check()
	if got := holder.Get().Leaf.DNSNames[0]; got != "two.example" {
		t.Fatalf("serving certificate %s after reload, want two.example", got)
	}
}

// TestReloadUnreadableFile: a credential file that cannot be read (here:
// deleted) is a refused reload like any other, reported once — not
// skipped in silence because the failed read has no content to digest.
func TestReloadUnreadableFile(t *testing.T) {
	ca := newTestCA(t, signer.ECDSAP256)
	dir := t.TempDir()
	writeCertDir(t, dir, map[string][]byte{certdir.FileToken: []byte(testToken), certdir.FileCACert: ca.pem})
	cd := CertDir{Dir: dir, SignerPublic: ca.signer.Public()}
	creds, d, err := cd.Credentials()
	if err != nil {
		t.Fatal(err)
	}
	var logs devtest.LockedBuffer
	m := NewMetrics(prometheus.NewRegistry(), "file", true)
	svc, err := New(Config{Signer: ca.signer, Credentials: creds, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	rl := &Reloader{Dir: cd, Service: svc, Metrics: m, Logger: slog.New(slog.NewJSONHandler(&logs, nil))}
	rl.Prime(d, Digest{})
	if err := os.Remove(filepath.Join(dir, certdir.FileToken)); err != nil {
		t.Fatal(err)
	}
	rl.Check()
	rl.Check()
	wantReloadFailed(t, m, 1, "with the token file gone")
	if got := testutil.ToFloat64(m.reloads.WithLabelValues("credentials", "error")); got != 1 {
		t.Fatalf("reload errors %v, want 1", got)
	}
	if !strings.Contains(logs.String(), "reload refused") {
		t.Fatal("unreadable token file not logged")
	}
	writeCertDir(t, dir, map[string][]byte{certdir.FileToken: []byte(testToken)})
	rl.Check()
	wantReloadFailed(t, m, 0, "with the token file back")
}

// TestReloadDropsRemovedTokenIndexes: after a rotation removes a token,
// trustd_token_used_total has no series for a token that no longer
// exists (a frozen counter would read as "a token nobody uses"), and the
// kept token keeps its series although its line moved.
func TestReloadDropsRemovedTokenIndexes(t *testing.T) {
	ca := newTestCA(t, signer.ECDSAP256)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "file", true)
	svc, err := New(Config{Signer: ca.signer, Credentials: ca.credentials(t, testToken+"\nnew-token"), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.tokenUsed); n != 2 {
		t.Fatalf("%d token series with two tokens, want 2", n)
	}
	m.tokenMatched(fingerprintOf("new-token"))
	svc.SetCredentials(ca.credentials(t, "new-token"))
	if n := testutil.CollectAndCount(m.tokenUsed); n != 1 {
		t.Fatalf("%d token series after removing a token, want 1", n)
	}
	if got := testutil.ToFloat64(m.tokenUsed.WithLabelValues(fingerprintOf("new-token"))); got != 1 {
		t.Fatalf("the kept token's count %v after it moved to line 1, want 1", got)
	}
}
