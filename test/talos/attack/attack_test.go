// Package attack runs steward-trustd, with its default limits, against
// clients that try to lock workers out or grow its memory, while Talos's
// own worker code (v1.14.1, pkg/grpc/gen.RemoteGenerator) asks for
// certificates: every worker attempt must succeed within Talos's 10 s,
// and the daemon's peak RSS is measured. Loopback only; bounded in
// connections, attempts and time.
//
// Benchmark run (more attempts, same attacks):
//
//	cd test/talos && go test -count=1 -run TestAttacks -v ./attack -args -attempts=200
package attack

import (
	"context"
	"crypto/x509"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	talosx509 "github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/grpc/gen"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
)

var (
	attempts   = flag.Int("attempts", 20, "worker attempts under each attack")
	concurrent = flag.Int("workers", 4, "worker attempts in flight at once")
	daemonBin  = flag.String("daemon", "", "run the suite against this steward-trustd binary instead of the tree's (e.g. an older build, to see a case fail)")
	binDir     string
)

// daemonBinary is the steward-trustd under test.
func daemonBinary() string {
	if *daemonBin != "" {
		return *daemonBin
	}
	return filepath.Join(binDir, "steward-trustd")
}

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := devtest.BuildBinaries(filepath.Join("..", "..", ".."), "./cmd/steward-trustd", "./cmd/steward-trustd-gencreds", "./cmd/steward-trustd-ceremony")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// tlsRoots is the OS CA the attacker's gRPC client trusts.
type tlsRoots struct{ pool *x509.CertPool }

// attack is one hostile client pattern.
type attack struct {
	name       string
	srcs       []string // attacker source addresses
	slots      int
	action     func(context.Context, *attacker, string) error
	maxRSS     int64 // bytes; 0: report only
	minHeld    int64 // the attack must have held at least this many connections at once
	minStreams int64 // and started at least this many request streams
	// minTime is how long the attack lasts at least: some limits act
	// after seconds (TCP_DEFER_ACCEPT's 3 s, EvictionGrace's 2 s).
	minTime time.Duration
	// metrics are series of the daemon's /metrics that must grow during
	// the attack: the attack is visible to monitoring.
	metrics []string
}

// sources returns n loopback addresses other than the worker's 127.0.0.1.
func sources(first, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "127.0.0." + strconv.Itoa(first+i)
	}
	return out
}

func TestAttacks(t *testing.T) {
	// Every limit at its default except one: Talos's worker code dials
	// from 127.0.0.1 for every simulated worker here, where real workers
	// each have their own address, so the per-address request rate
	// (1/s, burst 20) would measure itself rather than the attacks.
	d := startFrontDaemonIn(t, newCerts(t, "attack"), "TRUSTD_PEER_RATE=-1")
	roots := &tlsRoots{pool: x509.NewCertPool()}
	roots.pool.AppendCertsFromPEM(d.fleet.caPEM)
	w := &workers{addr: d.Addr, token: d.token, caPEM: d.fleet.caPEM, metricsURL: d.metricsURL}
	time.Sleep(time.Second) // let the start-up settle before measuring idle memory
	idle := rss(t, d.PID(), "VmRSS")
	t.Logf("idle RSS: %.1f MiB", mib(idle))

	attacks := []attack{
		{name: "none (baseline)", srcs: sources(10, 1), slots: 0},
		// First after the baseline: its memory is measured before the
		// 1,024-connection attacks have grown the heap.
		{name: "header flood 128 streams x 8 MiB", srcs: sources(40, 8), slots: 8, action: headerFlood(16, 8<<20), maxRSS: 64 << 20, minHeld: 1, minStreams: 128,
			metrics: []string{`trustd_connections_abandoned_total{stage="before_request"}`}},
		// 1,024: more than the unauthenticated budget's share for unknown
		// addresses (768 of 1,024 by default), from 32 addresses.
		{name: "1024 hanging streams", srcs: sources(100, 32), slots: 1024, action: hangingStream, minHeld: 256, minStreams: 1024, minTime: 5 * time.Second,
			metrics: []string{`trustd_connections_closed_total{limit="unauthenticated_evicted"}`, `trustd_connections_closed_total{limit="first_message_timeout"}`}},
		{name: "1024 idle TLS+HTTP/2 connections", srcs: sources(140, 32), slots: 1024, action: idleConnection, minHeld: 256, minTime: 5 * time.Second,
			metrics: []string{`trustd_connections_closed_total{limit="unauthenticated_evicted"}`}},
		// Held back by the kernel (TCP_DEFER_ACCEPT), closed at once
		// when handed over after 3 s.
		{name: "256 silent TCP sockets", srcs: sources(30, 8), slots: 256, action: silentSocket, minHeld: 64, minTime: 5 * time.Second,
			metrics: []string{`trustd_connections_refused_total{limit="no_data"}`}},
		{name: "wrong-token client on the worker's address", srcs: []string{"127.0.0.1"}, slots: 4, action: wrongTokenClient(roots), minStreams: 100,
			metrics: []string{`trustd_requests_denied_total{reason="auth"}`, `trustd_requests_denied_total{reason="rate_limit"}`}},
	}
	var report []string
	for _, at := range attacks {
		t.Run(at.name, func(t *testing.T) {
			res := runAttack(t, d.PID(), w, at)
			report = append(report, res.row(at.name))
			res.check(t, at)
		})
	}
	t.Logf("idle RSS %.1f MiB; worker attempts (Talos v1.14.1 RemoteGenerator, 10 s each):\n| attack | attempts ok | p50 | p99 | max | attacker conns opened (peak held) | attacker streams | daemon peak RSS |\n|---|---|---|---|---|---|---|---|\n%s",
		mib(idle), strings.Join(report, "\n"))
}

// check fails t unless the workers got their certificates, memory stayed
// bounded, and the attack actually took place.
func (r result) check(t *testing.T, at attack) {
	t.Helper()
	if need := int(math.Ceil(0.99 * float64(r.total))); r.ok < need {
		t.Errorf("%d of %d worker attempts got a certificate, want ≥ %d (errors: %v)", r.ok, r.total, need, r.errs)
	}
	if at.maxRSS > 0 && r.peakRSS > at.maxRSS {
		t.Errorf("daemon peak RSS %.1f MiB, want < %.0f MiB", mib(r.peakRSS), mib(at.maxRSS))
	}
	if r.peakHeld < at.minHeld || r.streams < at.minStreams {
		t.Errorf("the attacker held at most %d connections at once and started %d streams, want ≥ %d and ≥ %d: the attack did not take place",
			r.peakHeld, r.streams, at.minHeld, at.minStreams)
	}
}

// result is what one attack did to the workers and the daemon.
type result struct {
	ok, total        int
	latencies        []time.Duration
	errs             map[string]int
	peakRSS          int64
	opened, peakHeld int64
	streams          int64
}

func (r result) row(name string) string {
	sort.Slice(r.latencies, func(i, j int) bool { return r.latencies[i] < r.latencies[j] })
	q := func(p float64) time.Duration {
		if len(r.latencies) == 0 {
			return 0
		}
		return r.latencies[int(p*float64(len(r.latencies)-1))].Round(time.Millisecond)
	}
	return fmt.Sprintf("| %s | %d/%d (%.1f %%) | %v | %v | %v | %d (%d) | %d | %.1f MiB |", name, r.ok, r.total,
		100*float64(r.ok)/float64(r.total), q(0.5), q(0.99), q(1), r.opened, r.peakHeld, r.streams, mib(r.peakRSS))
}

// runAttack starts the attacker, gives it a second to take hold, runs the
// worker attempts, and stops the attacker.
func runAttack(t *testing.T, pid int, w *workers, at attack) result {
	t.Helper()
	resetPeakRSS(t, pid)
	before := scrape(t, w.metricsURL)
	ctx, cancel := context.WithCancel(context.Background())
	a := &attacker{addr: w.addr, srcs: at.srcs, slots: at.slots, action: at.action}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); a.run(ctx) }()
	if at.slots > 0 {
		sleepCtx(ctx, time.Second)
	}
	start := time.Now()
	res := w.attempt(t, *attempts, *concurrent)
	sleepCtx(ctx, time.Until(start.Add(at.minTime)))
	res.peakRSS = rss(t, pid, "VmHWM")
	after := scrape(t, w.metricsURL)
	for _, m := range at.metrics {
		if after[m] <= before[m] {
			t.Errorf("%s did not grow (%v → %v): the attack is invisible to monitoring", m, before[m], after[m])
		}
	}
	cancel()
	wg.Wait()
	res.opened, res.peakHeld, res.streams = a.opened.Load(), a.peak.Load(), a.streams.Load()
	time.Sleep(500 * time.Millisecond) // let the daemon see the attacker go
	return res
}

// workers runs Talos's worker code against the daemon.
type workers struct {
	addr, token string
	caPEM       []byte
	metricsURL  string
}

// attempt makes n worker attempts, c at a time, each with a fresh key and
// CSR and a fresh connection, bounded by Talos's 10 s attempt timeout.
func (w *workers) attempt(t *testing.T, n, c int) result {
	t.Helper()
	res := result{total: n, errs: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, c)
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			start := time.Now()
			err := w.one()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.errs[shortErr(err)]++
				return
			}
			res.ok++
			res.latencies = append(res.latencies, time.Since(start))
		}()
	}
	wg.Wait()
	return res
}

// one is a worker's certificate attempt exactly as machined makes it.
func (w *workers) one() error {
	accepted := []*talosx509.PEMEncodedCertificate{{Crt: w.caPEM}}
	ca, err := accepted[0].GetCert()
	if err != nil {
		return err
	}
	csr, _, err := talosx509.NewCSRAndIdentityFromCA(ca,
		talosx509.IPAddresses([]net.IP{net.ParseIP("127.0.0.1")}), talosx509.DNSNames([]string{"worker-1"}), talosx509.CommonName("worker-1"))
	if err != nil {
		return err
	}
	remote, err := gen.NewRemoteGenerator(w.token, []string{w.addr}, accepted)
	if err != nil {
		return err
	}
	defer remote.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, crt, err := remote.IdentityContext(ctx, csr)
	if err == nil && len(crt) == 0 {
		err = fmt.Errorf("empty certificate")
	}
	return err
}

func shortErr(err error) string {
	s := err.Error()
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}
