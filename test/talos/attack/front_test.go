package attack

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/internal/workerclient"
)

var (
	long      = flag.Bool("long", false, "front-door cases at the issue's full size and length (make bench-attack)")
	frontTime = flag.Duration("front-duration", 6*time.Second, "how long workers try under each front-door attack")
)

// frontCase is one row of the front-door table: an attacker, workers a
// write delay away, and what must hold.
type frontCase struct {
	name   string
	srcs   []string
	slots  int
	action func(context.Context, *attacker, string) error
	delay  time.Duration
	minOK  float64 // share of worker attempts that must succeed
	// grow are series that must grow: the attack is visible.
	grow []string
	// bounds are gauges whose maximum during the attack must stay within
	// the value given.
	bounds map[string]float64
	// after runs once the attacker has stopped.
	after func(t *testing.T, d *frontDaemon)
}

// frontDaemon is the daemon (all limits at their defaults) and what the
// front-door cases need of it.
type frontDaemon struct {
	*devtest.Daemon
	metricsURL, token string
	fleet             *fleet
}

// TestFrontDoor runs the round-two attacks (many-address flood, token
// holders with empty CSRs, reset race) against the daemon
// with its default limits: workers on their own addresses, a write delay
// away, under each attacker; they must get their certificates, the
// attack must show in the metrics, and the accounting must hold.
func TestFrontDoor(t *testing.T) {
	d := startFrontDaemon(t)
	cases := []frontCase{
		{name: "plain-TCP flood from 130 addresses with workers 25 ms away", srcs: rangeAddrs("127.1.0.", 130), slots: 130, action: silentSocket,
			delay: 25 * time.Millisecond, minOK: 0.9, grow: []string{`trustd_connections_refused_total{limit="no_data"}`},
			bounds: map[string]float64{`trustd_connections_open{state="unauthenticated"}`: 64}},
		{name: "token holders with empty CSRs from 5 addresses x 64", srcs: rangeAddrs("127.2.0.", 5), slots: 320, action: emptyCSRHolder(d),
			minOK: 0.9, grow: []string{`trustd_token_bad_requests_total{fingerprint="` + tokenFingerprint(d.token) + `"}`},
			// Only workers' requests in flight are authenticated.
			bounds: map[string]float64{`trustd_connections_open{state="authenticated"}`: 16}},
		{name: "reset race of 2000 resets from one address", srcs: []string{"127.3.0.1"}, slots: 8, action: resetRace(250),
			minOK: 0.99, bounds: map[string]float64{`trustd_connections_open{state="unauthenticated"}`: 1024},
			after: func(t *testing.T, d *frontDaemon) {
				waitGaugeZero(t, d.metricsURL, `trustd_connections_open{state="unauthenticated"}`)
			}},
	}
	var rows []string
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := runFrontCase(t, d, c)
			rows = append(rows, res.row(c.name))
			if need := int(math.Ceil(c.minOK * float64(res.total))); res.ok < need {
				t.Errorf("%d of %d worker attempts got a certificate, want ≥ %d (errors: %v)", res.ok, res.total, need, res.errs)
			}
		})
	}
	t.Logf("front door (default limits; workers each on their own address, 10 s attempts):\n| attack | attempts ok | p50 | p99 | max | attacker conns opened (peak held) | attacker streams | daemon peak RSS |\n|---|---|---|---|---|---|---|---|\n%s",
		strings.Join(rows, "\n"))
}

func startFrontDaemon(t *testing.T) *frontDaemon {
	return startFrontDaemonIn(t, newCerts(t, "front"))
}

// newCerts makes a cert dir with a file key for cluster.
func newCerts(t *testing.T, cluster string) string {
	certs := filepath.Join(t.TempDir(), "certs")
	if out, err := devtestRun(filepath.Join(binDir, "steward-trustd-gencreds"), "-cluster", cluster, "-output", certs); err != nil {
		t.Fatalf("gencreds: %v\n%s", err, out)
	}
	return certs
}

// startFrontDaemonIn starts the daemon on the cert dir certs with env
// besides the defaults.
func startFrontDaemonIn(t *testing.T, certs string, env ...string) *frontDaemon {
	token := strings.TrimSpace(string(mustRead(t, filepath.Join(certs, "token"))))
	caPEM := mustRead(t, filepath.Join(certs, "os-ca.crt"))
	healthPort := devtest.FreePort(t)
	d := devtest.StartDaemon(t, daemonBinary(), append([]string{"TRUSTD_CERT_DIR=" + certs, fmt.Sprintf("TRUSTD_HEALTH_ADDR=127.0.0.1:%d", healthPort)}, env...)...)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	f := &fleet{addr: d.Addr, token: token, caPEM: caPEM, tlsCfg: workerclient.TLSConfig(roots, "127.0.0.1")}
	return &frontDaemon{Daemon: d, metricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", healthPort), token: token, fleet: f}
}

// runFrontCase starts the attacker, gives it a second to take hold, runs
// the workers for the case's time, and checks what must grow and what
// must stay bounded.
func runFrontCase(t *testing.T, d *frontDaemon, c frontCase) result {
	t.Helper()
	resetPeakRSS(t, d.PID())
	before := scrape(t, d.metricsURL)
	watch := watchGauges(d.metricsURL, keys(c.bounds)...)
	ctx, cancel := context.WithCancel(context.Background())
	a := &attacker{addr: d.Addr, srcs: c.srcs, slots: c.slots, action: c.action}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); a.run(ctx) }()
	sleepCtx(ctx, time.Second)
	d.fleet.delay = c.delay
	res := d.fleet.run(20, 4, *frontTime)
	res.peakRSS = rss(t, d.PID(), "VmHWM")
	after := scrape(t, d.metricsURL)
	cancel()
	wg.Wait()
	for s, seen := range watch.maxima() {
		if seen > c.bounds[s] {
			t.Errorf("%s reached %v during the attack, want ≤ %v", s, seen, c.bounds[s])
		}
	}
	for _, m := range c.grow {
		if after[m] <= before[m] {
			t.Errorf("%s did not grow (%v → %v): the attack is invisible to monitoring", m, before[m], after[m])
		}
	}
	if c.after != nil {
		c.after(t, d)
	}
	res.opened, res.peakHeld, res.streams = a.opened.Load(), a.peak.Load(), a.streams.Load()
	return res
}

func keys(m map[string]float64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// tokenFingerprint is the daemon's label for a token: the first 16 hex
// digits of its SHA-256.
func tokenFingerprint(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])[:16]
}

// rangeAddrs is n addresses prefix1 … prefixn.
func rangeAddrs(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i+1)
	}
	return out
}

// waitGaugeZero waits until series is 0: every connection released.
func waitGaugeZero(t *testing.T, url, series string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		v := scrape(t, url)[series]
		if v == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s stuck at %v after the attacker left: the accounting lost track of connections", series, v)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// emptyCSRHolder is a client that holds the token: on each connection it
// sends one request with the valid token and an empty CSR, then an empty
// request every 25 s, keeping the connection for as long as the daemon
// lets it.
func emptyCSRHolder(d *frontDaemon) func(context.Context, *attacker, string) error {
	return func(ctx context.Context, a *attacker, src string) error {
		dialer := func(ctx context.Context, addr string) (net.Conn, error) { return dialFrom(ctx, src, addr) }
		cc, err := workerclient.Dial(a.addr, d.fleet.tlsCfg, grpc.WithContextDialer(dialer))
		if err != nil {
			return err
		}
		defer cc.Close()
		a.opened.Add(1)
		client := securityapi.NewSecurityServiceClient(cc)
		rctx := metadata.AppendToOutgoingContext(ctx, "token", d.token)
		for ctx.Err() == nil {
			a.streams.Add(1)
			_, err := client.Certificate(rctx, &securityapi.CertificateRequest{})
			if c := status.Code(err); c == codes.Unavailable || c == codes.Canceled {
				return err // the daemon closed the connection: reconnect
			}
			sleepCtx(ctx, 25*time.Second)
		}
		return nil
	}
}

// resetRace connects from one port of src, sends a byte (so the kernel
// hands the connection over), resets it (SO_LINGER 0) and reconnects
// from the same port at once, n times.
func resetRace(n int) func(context.Context, *attacker, string) error {
	var mu sync.Mutex
	port := 40000
	return func(ctx context.Context, a *attacker, src string) error {
		mu.Lock()
		port++
		p := port
		mu.Unlock()
		for range n {
			if ctx.Err() != nil {
				return nil
			}
			resetOnce(ctx, a, src, p)
		}
		<-ctx.Done()
		return nil
	}
}

func resetOnce(ctx context.Context, a *attacker, src string, port int) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src), Port: port}, Timeout: 2 * time.Second,
		Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
		}}
	c, err := d.DialContext(ctx, "tcp", a.addr)
	if err != nil {
		return
	}
	a.opened.Add(1)
	_, _ = c.Write([]byte{0x16})
	_ = c.(*net.TCPConn).SetLinger(0)
	_ = c.Close()
}
