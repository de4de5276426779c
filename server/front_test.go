package server

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/signer"
)

// frontServer is a FrontDoor on loopback with its metrics and logs.
type frontServer struct {
	addr    string
	front   *FrontDoor
	metrics *Metrics
	logs    *devtest.LockedBuffer
	roots   *x509.CertPool
	signer  *failingSigner
	svc     *Service
}

func startFront(t *testing.T, lim ConnLimits) *frontServer {
	t.Helper()
	ca := newTestCA(t, signer.ECDSAP256)
	fs := &failingSigner{Signer: ca.signer}
	logs := &devtest.LockedBuffer{}
	m := NewMetrics(prometheus.NewRegistry(), "file", true)
	svc, err := New(Config{Signer: fs, Credentials: ca.credentials(t, testToken+"\nsecond-token"), Metrics: m,
		Logger: slog.New(slog.NewJSONHandler(logs, nil)), RateLimits: RateLimits{PerPeerRate: -1}})
	if err != nil {
		t.Fatal(err)
	}
	holder := &CertHolder{}
	si := &SelfIssuer{Holder: holder, Signer: ca.signer, CA: func() *x509.Certificate { return ca.cert },
		Hosts: func() ([]string, error) { return []string{"127.0.0.1"}, nil }}
	if err := si.Issue(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := NewFrontDoor(FrontDoorConfig{Listener: ln, Service: svc, TLS: TLSConfig(holder.GetCertificate), Limits: lim, ShutdownGrace: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("front door: %v", err)
		}
	})
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	return &frontServer{addr: ln.Addr().String(), front: f, metrics: m, logs: logs, roots: roots, signer: fs, svc: svc}
}

// dialFrom opens a TCP connection to fs from the loopback address src.
func (fs *frontServer) dialFrom(t *testing.T, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", fs.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sendFrom opens a TCP connection from src and sends one byte (the
// first of a TLS record), so that the kernel hands it over at once
// despite TCP_DEFER_ACCEPT; then it stays silent.
func (fs *frontServer) sendFrom(t *testing.T, src string) net.Conn {
	t.Helper()
	c := fs.dialFrom(t, src)
	if _, err := c.Write([]byte{0x16}); err != nil {
		t.Fatal(err)
	}
	return c
}

// client is a gRPC client from src.
func (fs *frontServer) client(t *testing.T, src string) *grpc.ClientConn {
	t.Helper()
	dialer := func(ctx context.Context, addr string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		return d.DialContext(ctx, "tcp", addr)
	}
	conn, err := grpc.NewClient(fs.addr, grpc.WithContextDialer(dialer),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: fs.roots, ServerName: "127.0.0.1"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func (fs *frontServer) certificate(t *testing.T, conn *grpc.ClientConn, token string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "token", token), 5*time.Second)
	defer cancel()
	req := &securityapi.CertificateRequest{Csr: makeCSR(t, csrSpec{key: newKey(t, "p256"), dns: []string{"w"}})}
	_, err := securityapi.NewSecurityServiceClient(conn).Certificate(ctx, req)
	return err
}

func (fs *frontServer) closed(limit string) float64 {
	return testutil.ToFloat64(fs.metrics.connsClosed.WithLabelValues(limit))
}

// waitClosed waits until the server closes c.
func waitClosed(t *testing.T, c net.Conn, within time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(within))
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("connection still open after %v", within)
		}
		return
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPerAddressCap(t *testing.T) {
	fs := startFront(t, ConnLimits{MaxPerAddress: 3, HandshakeTimeout: time.Minute})
	for i := 0; i < 3; i++ {
		fs.sendFrom(t, "127.0.0.2")
	}
	eventually(t, "three connections open", func() bool { return fs.front.lis.open() == 3 })
	extra := fs.sendFrom(t, "127.0.0.2")
	waitClosed(t, extra, 2*time.Second)
	if got := testutil.ToFloat64(fs.metrics.connsRefused.WithLabelValues(closedPerAddress)); got != 1 {
		t.Fatalf("refused per address %v, want 1", got)
	}
	// Another address is not affected.
	if err := fs.certificate(t, fs.client(t, "127.0.0.1"), testToken); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(fs.logs.String(), "TRUSTD_MAX_CONNECTIONS_PER_ADDRESS"); n != 1 {
		t.Fatalf("per-address refusals logged %d times, want once per episode", n)
	}
}

func TestUnauthenticatedEviction(t *testing.T) {
	fs := startFront(t, ConnLimits{MaxConnections: 8, MaxUnauthenticated: 4, HandshakeTimeout: time.Minute, EvictionGrace: 100 * time.Millisecond})
	var silent []net.Conn
	// Three: a quarter of the budget is kept for known workers.
	for i := 0; i < 3; i++ {
		silent = append(silent, fs.sendFrom(t, "127.0.0.3"))
	}
	time.Sleep(150 * time.Millisecond) // past their grace
	eventually(t, "three silent connections", func() bool { return fs.front.lis.open() == 3 })
	// A worker on another address still gets in: it evicts the oldest
	// connection of the busiest address.
	worker := fs.client(t, "127.0.0.1")
	if err := fs.certificate(t, worker, testToken); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, silent[0], 2*time.Second)
	if got := fs.closed(closedEvicted); got < 1 {
		t.Fatalf("evictions %v, want ≥ 1", got)
	}
	fs.front.lis.Sweep()
	if got := testutil.ToFloat64(fs.metrics.frontDoorState.WithLabelValues(frontEvicting)); got != 1 {
		t.Fatalf("evicting state %v after an eviction, want 1", got)
	}
	// Served, the worker's connection is idle, not authenticated: a token
	// is no lease on a slot.
	eventually(t, "worker idle", func() bool {
		return testutil.ToFloat64(fs.metrics.connsOpen.WithLabelValues(stateIdle)) == 1 &&
			testutil.ToFloat64(fs.metrics.connsOpen.WithLabelValues(stateAuthenticated)) == 0
	})
}

// TestServedConnectionIsClosedSoon: after its request a worker's
// connection gets a GOAWAY after RequestIdleTimeout, long before an
// unauthenticated one's AuthTimeout.
func TestServedConnectionIsClosedSoon(t *testing.T) {
	fs := startFront(t, ConnLimits{RequestIdleTimeout: 300 * time.Millisecond, AuthTimeout: time.Minute, HandshakeTimeout: time.Minute})
	worker := fs.client(t, "127.0.0.1")
	if err := fs.certificate(t, worker, testToken); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	eventually(t, "served connection closed", func() bool { return fs.front.lis.open() == 0 })
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("served connection lived %v after its request, want about 300ms", d)
	}
}

// TestSilentSocketNeverTakesASlot: with TCP_DEFER_ACCEPT a socket that
// sends nothing is not handed over; when the kernel gives it up after the
// deferral, it is closed at once.
func TestSilentSocketNeverTakesASlot(t *testing.T) {
	fs := startFront(t, ConnLimits{DeferAccept: time.Second})
	c := fs.dialFrom(t, "127.0.0.9")
	time.Sleep(300 * time.Millisecond)
	if n := fs.front.lis.open(); n != 0 {
		t.Fatalf("%d connections open: a silent socket took a slot", n)
	}
	if err := fs.certificate(t, fs.client(t, "127.0.0.1"), testToken); err != nil {
		t.Fatal(err)
	}
	_ = c
}

// TestEmptyRequestIsNoLease: a valid token with an empty CSR is refused,
// charged to the address and counted against the token's index, and
// the connection stays unauthenticated (evictable, auth timeout).
func TestEmptyRequestIsNoLease(t *testing.T) {
	fs := startFront(t, ConnLimits{AuthTimeout: 500 * time.Millisecond})
	conn := fs.client(t, "127.0.0.10")
	ctx := metadata.AppendToOutgoingContext(context.Background(), "token", testToken)
	client := securityapi.NewSecurityServiceClient(conn)
	codesSeen := map[codes.Code]int{}
	for range 8 {
		_, err := client.Certificate(ctx, &securityapi.CertificateRequest{})
		codesSeen[status.Code(err)]++
		if got := testutil.ToFloat64(fs.metrics.connsOpen.WithLabelValues(stateAuthenticated)); got != 0 {
			t.Fatalf("an empty request made its connection authenticated (%v)", got)
		}
	}
	if codesSeen[codes.InvalidArgument] == 0 || codesSeen[codes.ResourceExhausted] == 0 {
		t.Fatalf("answers %v: want InvalidArgument, then ResourceExhausted once the address's bad-request budget is spent", codesSeen)
	}
	if got := testutil.ToFloat64(fs.metrics.tokenBadRequests.WithLabelValues(fs.svc.Credentials().tokens.fingerprint(0))); got != 8 {
		t.Fatalf("bad requests counted against the token's fingerprint: %v, want 8", got)
	}
	eventually(t, "auth timeout", func() bool { return fs.closed(closedAuthTimeout) >= 1 })
}

func TestConnectionDeadlines(t *testing.T) {
	fs := startFront(t, ConnLimits{HandshakeTimeout: 200 * time.Millisecond, AuthTimeout: 600 * time.Millisecond, FirstMessageTimeout: 200 * time.Millisecond})
	t.Run("silent socket", func(t *testing.T) {
		c := fs.sendFrom(t, "127.0.0.5")
		waitClosed(t, c, 2*time.Second)
		eventually(t, "handshake timeout counted", func() bool { return fs.closed(closedHandshake) >= 1 })
	})
	t.Run("idle set-up connection", func(t *testing.T) {
		c := tls.Client(fs.dialFrom(t, "127.0.0.6"), &tls.Config{RootCAs: fs.roots, ServerName: "127.0.0.1", NextProtos: []string{"h2"}})
		if err := c.Handshake(); err != nil {
			t.Fatal(err)
		}
		// HTTP/2 preface and an empty SETTINGS frame (RFC 9113 §3.4).
		if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		waitClosed(t, c, 3*time.Second)
		if d := time.Since(start); d < 300*time.Millisecond {
			t.Fatalf("closed after %v: the handshake timeout applied, not the auth timeout", d)
		}
		eventually(t, "auth timeout counted", func() bool { return fs.closed(closedAuthTimeout) >= 1 })
	})
	t.Run("stream without its message", func(t *testing.T) {
		conn := fs.client(t, "127.0.0.7")
		ctx := metadata.AppendToOutgoingContext(context.Background(), "token", "anything")
		st, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, methodCertificate)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := st.RecvMsg(&securityapi.CertificateResponse{}); status.Code(err) == codes.OK {
			t.Fatal("hanging stream answered")
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("hanging stream lived %v", d)
		}
		eventually(t, "reset counted", func() bool {
			return testutil.ToFloat64(fs.metrics.streamsReset.WithLabelValues(closedFirstMessage)) >= 1
		})
	})
}

func TestOversizedAndHeaderBounds(t *testing.T) {
	fs := startFront(t, ConnLimits{MaxHeaderBytes: 4096})
	conn := fs.client(t, "127.0.0.1")
	ctx := metadata.AppendToOutgoingContext(context.Background(), "token", testToken)
	_, err := securityapi.NewSecurityServiceClient(conn).Certificate(ctx, &securityapi.CertificateRequest{Csr: make([]byte, 70<<10)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized: %v", err)
	}
	eventually(t, "oversized counted", func() bool { return testutil.ToFloat64(fs.metrics.denied.WithLabelValues("oversized")) == 1 })
	if !strings.Contains(fs.logs.String(), `"outcome":"denied_oversized"`) {
		t.Fatal("no audit line for the oversized request")
	}
	big := metadata.AppendToOutgoingContext(ctx, "x-padding", strings.Repeat("a", 64<<10))
	if _, err := securityapi.NewSecurityServiceClient(conn).Certificate(big, &securityapi.CertificateRequest{Csr: []byte("x")}); err == nil {
		t.Fatal("64 KiB of metadata accepted")
	}
	if err := fs.certificate(t, fs.client(t, "127.0.0.1"), "second-token"); err != nil {
		t.Fatalf("second token after the floods: %v", err)
	}
	if got := testutil.ToFloat64(fs.metrics.tokenUsed.WithLabelValues(fingerprintOf("second-token"))); got != 1 {
		t.Fatalf("the second token used %v times, want 1", got)
	}
}

func TestDrainOnSignerNotReady(t *testing.T) {
	fs := startFront(t, ConnLimits{})
	r := NewReadiness(fs.signer, 30*time.Second, nil, fs.metrics)
	r.OnSignerNotReady(fs.front.Drain, fs.svc.log)
	r.Observe(nil)
	conn := fs.client(t, "127.0.0.1")
	if err := fs.certificate(t, conn, testToken); err != nil {
		t.Fatal(err)
	}
	r.Observe(errors.New("device gone"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if !conn.WaitForStateChange(ctx, connectivity.Ready) {
		t.Fatal("connection still ready: no GOAWAY")
	}
	if got := fs.closed(closedNotReady); got != 1 {
		t.Fatalf("closed for signer_not_ready %v, want 1", got)
	}
	// The daemon still takes new connections.
	if err := fs.certificate(t, conn, testToken); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(fs.logs.String(), "signer not ready: closing open connections"); n != 1 {
		t.Fatalf("not-ready logged %d times", n)
	}
}

func TestPanicBecomesInternal(t *testing.T) {
	fs := startFront(t, ConnLimits{})
	fs.signer.setPanic(true)
	conn := fs.client(t, "127.0.0.1")
	for i := 0; i < 2; i++ {
		if err := fs.certificate(t, conn, testToken); status.Code(err) != codes.Internal {
			t.Fatalf("panic answered %v, want Internal", err)
		}
	}
	if n := strings.Count(fs.logs.String(), "panic in request handler"); n != 2 {
		t.Fatalf("%d panic log lines, want one per panic", n)
	}
	if got := testutil.ToFloat64(fs.metrics.signerInflight); got != 0 {
		t.Fatalf("signer in-flight gauge %v after panics, want 0 (slots leaked)", got)
	}
	fs.signer.setPanic(false)
	if err := fs.certificate(t, conn, testToken); err != nil {
		t.Fatalf("after a panic: %v", err)
	}
}

// blockingSigner holds every signature until release is closed: the
// requests stay in flight, their connections authenticated.
type blockingSigner struct {
	signer.Signer
	release chan struct{}
}

func (b *blockingSigner) Sign(r io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	<-b.release
	return b.Signer.Sign(r, d, o)
}

// TestFullOfAuthenticatedWorkers: with every slot carrying a request in
// flight, a new connection waits in the kernel's accept queue (it is not
// accepted and then cut), and gets in once a request ends.
func TestFullOfAuthenticatedWorkers(t *testing.T) {
	fs := startFront(t, ConnLimits{MaxConnections: 2, MaxUnauthenticated: 2, MaxAuthenticatedPerPrefix: 2})
	release := make(chan struct{})
	fs.signer.Signer = &blockingSigner{Signer: fs.signer.Signer, release: release}
	fs.front.lis.mu.Lock()
	fs.front.lis.stuckGrace = 200 * time.Millisecond
	fs.front.lis.mu.Unlock()
	done := make(chan error, 3)
	for _, src := range []string{"127.0.0.1", "127.0.0.2"} {
		go func() { done <- fs.certificate(t, fs.client(t, src), testToken) }()
	}
	eventually(t, "two requests in flight", func() bool {
		return testutil.ToFloat64(fs.metrics.connsOpen.WithLabelValues(stateAuthenticated)) == 2
	})
	third := fs.client(t, "127.0.0.3")
	go func() { done <- fs.certificate(t, third, testToken) }()
	time.Sleep(300 * time.Millisecond)
	if n := fs.front.lis.open(); n != 2 {
		t.Fatalf("%d connections open at a cap of 2", n)
	}
	eventually(t, "not ready while workers wait", func() bool { return fs.front.Check() != nil })
	close(release)
	for range 3 {
		if err := <-done; err != nil {
			t.Fatalf("a worker was cut: %v", err)
		}
	}
	eventually(t, "ready again", func() bool { return fs.front.Check() == nil })
}

func TestMappedAddressesMatch(t *testing.T) {
	mapped := &net.TCPAddr{IP: net.ParseIP("::ffff:10.0.0.1"), Port: 4000}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: mapped})
	if got := peerAddress(ctx); got != netip.MustParseAddrPort("10.0.0.1:4000") || got != addrPortOf(mapped) {
		t.Fatalf("peer %v, listener key %v: a dual-stack socket's IPv4 peers would never authenticate", got, addrPortOf(mapped))
	}
}

// TestHeaderFloodIsVisible: a header list far over the bound closes the
// connection (x/net's framer), before any request reaches the daemon; it
// is counted as abandoned before a request.
func TestHeaderFloodIsVisible(t *testing.T) {
	fs := startFront(t, ConnLimits{MaxHeaderBytes: 4096})
	c := tls.Client(fs.dialFrom(t, "127.0.0.8"), &tls.Config{RootCAs: fs.roots, ServerName: "127.0.0.1", NextProtos: []string{"h2"}})
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":path", methodCertificate}, {":authority", "x"}, {"content-type", "application/grpc"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for range 16 {
		_ = enc.WriteField(hpack.HeaderField{Name: "x-pad", Value: strings.Repeat("p", 4<<10), Sensitive: true})
	}
	b := block.Bytes()
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: b[:16<<10]})
	for rest := b[16<<10:]; err == nil && len(rest) > 0; rest = rest[min(16<<10, len(rest)):] {
		err = fr.WriteContinuation(1, len(rest) <= 16<<10, rest[:min(16<<10, len(rest))])
	}
	waitClosed(t, c, 3*time.Second)
	eventually(t, "abandoned connection counted", func() bool {
		return testutil.ToFloat64(fs.metrics.connsAbandoned.WithLabelValues(abandonedBeforeRequest)) >= 1
	})
}
