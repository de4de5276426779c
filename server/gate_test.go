package server

import (
	"bytes"
	"context"
	"crypto"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/steward-trustd/steward-trustd/signer"
)

func isSaturated(err error) bool { var s *saturatedError; return errors.As(err, &s) }

// testGate is a gate with slots holders at once on a fake clock.
func testGate(slots, maxQueue int) (*signerGate, *fakeClock) {
	clk := newFakeClock()
	g := newSignerGate(maxQueue, 2*time.Second, clk.now)
	g.slots = slots
	return g, clk
}

// granted reports whether w was granted the signer (true), refused
// (false, err), or still waits (false, nil).
func granted(w *waiter) (bool, error) {
	select {
	case err := <-w.done:
		if err != nil {
			return false, err
		}
		return true, nil
	default:
		return false, nil
	}
}

func mustJoin(t *testing.T, g *signerGate, key string, deadline time.Time) *waiter {
	t.Helper()
	w, err := g.join(key, deadline)
	if err != nil {
		t.Fatalf("join %s: %v", key, err)
	}
	return w
}

func release(g *signerGate) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.releaseLocked(true)
}

// setInterval seeds the service estimate as if the device had been measured.
func setInterval(g *signerGate, d time.Duration) { g.est.interval = d }

func TestSignerGateServesInArrivalOrder(t *testing.T) {
	cases := []struct {
		name  string
		slots int
		n     int
	}{
		{"serial device", 1, 50},
		{"two slots", 2, 50},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, clk := testGate(c.slots, 1024)
			far := clk.now().Add(time.Hour)
			var ws []*waiter
			for i := 0; i < c.n; i++ {
				ws = append(ws, mustJoin(t, g, fmt.Sprint("csr-", i), far))
				clk.add(time.Millisecond)
			}
			var order []int
			for len(order) < c.n {
				for i, w := range ws {
					if ok, err := granted(w); err != nil {
						t.Fatalf("waiter %d refused: %v", i, err)
					} else if ok {
						order = append(order, i)
					}
				}
				release(g)
			}
			for i, got := range order {
				if got != i {
					t.Fatalf("grant order %v, want arrival order", order)
				}
			}
		})
	}
}

func TestSignerGateRetryKeepsPlace(t *testing.T) {
	g, clk := testGate(1, 1024)
	setInterval(g, 100*time.Millisecond)
	holder := mustJoin(t, g, "holder", clk.now().Add(time.Minute))
	if ok, _ := granted(holder); !ok {
		t.Fatal("first request not granted at once")
	}
	// "early" arrives with a deadline the queue cannot meet: refused, but
	// its first arrival is remembered.
	if _, err := g.join("early", clk.now().Add(150*time.Millisecond)); !isSaturated(err) {
		t.Fatalf("early: %v, want saturated", err)
	}
	clk.add(time.Second)
	late := mustJoin(t, g, "late", clk.now().Add(10*time.Second))
	clk.add(time.Second)
	early := mustJoin(t, g, "early", clk.now().Add(10*time.Second))
	release(g)
	if ok, _ := granted(early); !ok {
		t.Fatal("the retried early request did not go ahead of the later one")
	}
	if ok, err := granted(late); ok || err != nil {
		t.Fatalf("late: granted=%v err=%v, want still waiting", ok, err)
	}
}

func TestSignerGateAdmission(t *testing.T) {
	cases := []struct {
		name     string
		interval time.Duration
		deadline time.Duration
		maxQueue int
		want     int // requests lined up (holding or waiting)
	}{
		{"60 ms chip, 10 s attempts: the line holds up to the bound", 60 * time.Millisecond, 10 * time.Second, 1024, 1024},
		{"unmeasured device: up to the bound", 0, 10 * time.Second, 64, 64},
		{"deadline shorter than one signature", 60 * time.Millisecond, 100 * time.Millisecond, 1024, 0},
		{"deadline shorter than two: only the first", 60 * time.Millisecond, 200 * time.Millisecond, 1024, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, clk := testGate(1, c.maxQueue)
			setInterval(g, c.interval)
			deadline := clk.now().Add(c.deadline)
			admitted := 0
			for i := 0; i < 2000; i++ {
				if _, err := g.join(fmt.Sprint(i), deadline); err != nil {
					if !isSaturated(err) {
						t.Fatal(err)
					}
					continue
				}
				admitted++
			}
			if admitted != c.want {
				t.Fatalf("admitted %d, want %d", admitted, c.want)
			}
		})
	}
}

// TestSignerGateAnswersBeforeDeadline: a request whose turn does not come
// before its deadline waits, then gets ResourceExhausted (not
// DeadlineExceeded) before the deadline, without reaching the device.
func TestSignerGateAnswersBeforeDeadline(t *testing.T) {
	g := newSignerGate(1024, 2*time.Second, time.Now)
	g.slots = 1
	setInterval(g, 100*time.Millisecond)
	holder, err := g.acquire(context.Background(), "holder", time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer holder()
	for i := 0; i < 3; i++ {
		mustJoin(t, g, fmt.Sprint("ahead-", i), time.Now().Add(time.Minute))
	}
	deadline := time.Now().Add(300 * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	_, err = g.acquire(ctx, "late", deadline)
	if !isSaturated(err) {
		t.Fatalf("doomed request: %v, want saturated", err)
	}
	if time.Now().After(deadline) {
		t.Fatal("answered after the deadline")
	}
	if busy, queued, _ := g.stats(); busy != 1 || queued != 3 {
		t.Fatalf("busy=%d queued=%d, want 1 and 3", busy, queued)
	}
}

func TestSignerGateSkipsExpired(t *testing.T) {
	g, clk := testGate(1, 1024)
	setInterval(g, 50*time.Millisecond)
	holder := mustJoin(t, g, "holder", clk.now().Add(time.Minute))
	short := mustJoin(t, g, "short", clk.now().Add(500*time.Millisecond))
	long := mustJoin(t, g, "long", clk.now().Add(time.Minute))
	if ok, _ := granted(holder); !ok {
		t.Fatal("holder not granted")
	}
	clk.add(time.Second) // the device took long; short's deadline passed
	release(g)
	if ok, err := granted(short); ok || !isSaturated(err) {
		t.Fatalf("expired request: granted=%v err=%v, want refused without reaching the device", ok, err)
	}
	if ok, _ := granted(long); !ok {
		t.Fatal("the next live request was not granted")
	}
}

// TestSignerGateFullLineRefusesYoungest: at the bound, a request with an
// older ticket takes the place of the youngest in line.
func TestSignerGateFullLineRefusesYoungest(t *testing.T) {
	g, clk := testGate(1, 3)
	setInterval(g, 100*time.Millisecond)
	mustJoin(t, g, "holder", clk.now().Add(time.Minute))
	if _, err := g.join("old", clk.now().Add(150*time.Millisecond)); !isSaturated(err) {
		t.Fatalf("old: %v, want saturated", err)
	}
	clk.add(10 * time.Millisecond)
	first := mustJoin(t, g, "first", clk.now().Add(time.Minute))
	young := mustJoin(t, g, "young", clk.now().Add(time.Minute))
	if _, err := g.join("younger", clk.now().Add(time.Minute)); !isSaturated(err) {
		t.Fatalf("over the bound: %v, want saturated", err)
	}
	mustJoin(t, g, "old", clk.now().Add(time.Minute))
	if ok, err := granted(young); ok || !isSaturated(err) {
		t.Fatalf("youngest in a full line: granted=%v err=%v, want refused at once", ok, err)
	}
	if ok, err := granted(first); ok || err != nil {
		t.Fatalf("first: granted=%v err=%v, want still waiting", ok, err)
	}
}

func TestSignerGateBounds(t *testing.T) {
	g, clk := testGate(2, 4)
	far := clk.now().Add(time.Hour)
	for i := 0; i < 4; i++ {
		mustJoin(t, g, fmt.Sprint(i), far)
	}
	_, err := g.join("over", far)
	if !isSaturated(err) || !strings.Contains(err.Error(), "TRUSTD_SIGNER_QUEUE") {
		t.Fatalf("over the bound: %v", err)
	}
	if busy, queued, _ := g.stats(); busy != 2 || queued != 2 {
		t.Fatalf("busy=%d queued=%d, want 2 and 2", busy, queued)
	}
	// The ticket book is bounded too.
	for i := 0; i < 10*g.tickets.max; i++ {
		g.tickets.take(fmt.Sprint("k", i), clk.now())
	}
	if n := len(g.tickets.first); n > g.tickets.max {
		t.Fatalf("ticket book holds %d, bound %d", n, g.tickets.max)
	}
	clk.add(ticketTTL)
	g.tickets.take("fresh", clk.now())
	if n := len(g.tickets.first); n != 1 {
		t.Fatalf("ticket book holds %d after expiry, want 1", n)
	}
}

// TestSignerGateEstimateConverges keeps the gate saturated on simulated
// devices and checks the measured service interval: the signing time for
// a serial device (a TPM, whatever the number of holders), the signing
// time divided by the parallelism for a parallel one.
func TestSignerGateEstimateConverges(t *testing.T) {
	cases := []struct {
		name     string
		sign     time.Duration
		parallel bool
		want     time.Duration
	}{
		{"file key, 2 cores", 400 * time.Microsecond, true, 200 * time.Microsecond},
		{"swtpm", 1200 * time.Microsecond, false, 1200 * time.Microsecond},
		{"fast TPM chip", 20 * time.Millisecond, false, 20 * time.Millisecond},
		{"slow TPM chip", 60 * time.Millisecond, false, 60 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, clk := testGate(2, 1024)
			sim := deviceSim{g: g, clk: clk, sign: c.sign, parallel: c.parallel}
			for i := 0; i < 300; i++ {
				sim.fill(t, 8)
				sim.completeNext(t)
			}
			_, _, got := g.stats()
			if got < c.want*95/100 || got > c.want*105/100 {
				t.Fatalf("service interval %v, want about %v", got, c.want)
			}
		})
	}
}

// deviceSim drives a gate like a device would: granted requests finish
// one signing time after they start, one at a time unless parallel.
type deviceSim struct {
	g        *signerGate
	clk      *fakeClock
	sign     time.Duration
	parallel bool
	n        int
	waiting  []*waiter
	finishes []time.Time // of requests holding the signer, in order
	devFree  time.Time
}

func (d *deviceSim) fill(t *testing.T, queued int) {
	for len(d.waiting) < queued {
		d.n++
		d.waiting = append(d.waiting, mustJoin(t, d.g, fmt.Sprint(d.n), d.clk.now().Add(time.Hour)))
		d.collect(t)
	}
}

// collect starts the requests the gate granted.
func (d *deviceSim) collect(t *testing.T) {
	kept := d.waiting[:0]
	for _, w := range d.waiting {
		ok, err := granted(w)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			kept = append(kept, w)
			continue
		}
		start := d.clk.now()
		if !d.parallel && d.devFree.After(start) {
			start = d.devFree
		}
		d.devFree = start.Add(d.sign)
		d.finishes = append(d.finishes, d.devFree)
	}
	d.waiting = kept
}

func (d *deviceSim) completeNext(t *testing.T) {
	next := 0
	for i, f := range d.finishes {
		if f.Before(d.finishes[next]) {
			next = i
		}
	}
	d.clk.add(d.finishes[next].Sub(d.clk.now()))
	d.finishes = append(d.finishes[:next], d.finishes[next+1:]...)
	release(d.g)
	d.collect(t)
}

func TestSignerGateAbandon(t *testing.T) {
	g, clk := testGate(1, 1024)
	holder, err := g.acquire(context.Background(), "holder", clk.now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := g.acquire(ctx, "waiter", clk.now().Add(time.Hour)); done <- err }()
	for _, queued, _ := g.stats(); queued == 0; _, queued, _ = g.stats() {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled waiter: %v", err)
	}
	if busy, queued, _ := g.stats(); busy != 1 || queued != 0 {
		t.Fatalf("busy=%d queued=%d after cancel, want 1 and 0", busy, queued)
	}
	holder()
	holder() // a second release is harmless
	if busy, _, _ := g.stats(); busy != 0 {
		t.Fatalf("busy=%d after release", busy)
	}
}

func TestSignerGateLogsStateChanges(t *testing.T) {
	var buf bytes.Buffer
	g, clk := testGate(1, 1024)
	g.observe(slog.New(slog.NewTextHandler(&buf, nil)), nil, "tpm")
	setInterval(g, 100*time.Millisecond)
	mustJoin(t, g, "holder", clk.now().Add(time.Hour))
	mustJoin(t, g, "queued", clk.now().Add(time.Hour))
	for i := 0; i < 20; i++ {
		if _, err := g.join(fmt.Sprint(i), clk.now().Add(150*time.Millisecond)); !isSaturated(err) {
			t.Fatalf("request %d: %v, want saturated", i, err)
		}
	}
	release(g)
	release(g)
	logs := buf.String()
	if n := strings.Count(logs, "signer saturated"); n != 1 {
		t.Fatalf("%d saturated lines, want 1:\n%s", n, logs)
	}
	if !strings.Contains(logs, "signer keeping up again") || !strings.Contains(logs, "refused=20") {
		t.Fatalf("no recovery line with the refusal count:\n%s", logs)
	}
}

// gateSigner blocks every Sign until released.
type gateSigner struct {
	signer.Signer
	entered chan struct{}
	release chan struct{}
}

func (g *gateSigner) Sign(r io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	g.entered <- struct{}{}
	<-g.release
	return g.Signer.Sign(r, d, o)
}

// TestBoundedSignerQueue: beyond TRUSTD_SIGNER_QUEUE requests fail at
// once with ResourceExhausted, counted as a saturated signer, not as a
// per-address limit.
func TestBoundedSignerQueue(t *testing.T) {
	ca := newTestCA(t, signer.ECDSAP256)
	gate := &gateSigner{Signer: ca.signer, entered: make(chan struct{}, 16), release: make(chan struct{})}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "file", true)
	svc, err := New(Config{Signer: gate, Credentials: ca.credentials(t, testToken), Metrics: m,
		RateLimits: RateLimits{MaxSignerQueue: 2, PerPeerRate: -1}})
	if err != nil {
		t.Fatal(err)
	}
	req := &securityapi.CertificateRequest{Csr: makeCSR(t, csrSpec{key: newKey(t, "p256"), dns: []string{"w"}})}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); _, err := svc.Certificate(ctxFrom("10.0.0.1"), req); errs <- err }()
	}
	<-gate.entered
	<-gate.entered
	for i := 0; i < 5; i++ {
		if _, err := svc.Certificate(ctxFrom("10.0.0.1"), req); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("request over the bound: %v, want ResourceExhausted", err)
		}
	}
	if got := testutil.ToFloat64(m.signerInflight); got != 2 {
		t.Fatalf("inflight gauge %v, want 2", got)
	}
	close(gate.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(m.denied.WithLabelValues("saturated")); got != 5 {
		t.Fatalf("saturated denials %v, want 5", got)
	}
	if got := testutil.ToFloat64(m.denied.WithLabelValues("rate_limit")); got != 0 {
		t.Fatalf("rate_limit denials %v, want 0", got)
	}
}

// TestLateSignatureCounted: a signature that completes after the
// request's deadline is counted as wasted device work.
func TestLateSignatureCounted(t *testing.T) {
	ca := newTestCA(t, signer.ECDSAP256)
	gate := &gateSigner{Signer: ca.signer, entered: make(chan struct{}, 1), release: make(chan struct{})}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "tpm", false)
	svc, err := New(Config{Signer: gate, Credentials: ca.credentials(t, testToken), Metrics: m, RateLimits: RateLimits{PerPeerRate: -1}})
	if err != nil {
		t.Fatal(err)
	}
	req := &securityapi.CertificateRequest{Csr: makeCSR(t, csrSpec{key: newKey(t, "p256"), dns: []string{"w"}})}
	ctx, cancel := context.WithCancel(ctxFrom("10.0.0.1"))
	done := make(chan error, 1)
	go func() { _, err := svc.Certificate(ctx, req); done <- err }()
	<-gate.entered
	cancel()
	close(gate.release)
	<-done
	if got := testutil.ToFloat64(m.gate.late); got != 1 {
		t.Fatalf("late signatures %v, want 1", got)
	}
}

func TestSignerGateSlotsByBackend(t *testing.T) {
	cases := []struct {
		backend  string
		maxQueue int
		want     int
	}{
		{"tpm", 1024, serialSignerSlots},
		{"pkcs11", 1024, max(runtime.GOMAXPROCS(0), parallelSignerSlots)},
		{"file", 1024, max(runtime.GOMAXPROCS(0), parallelSignerSlots)},
		{"pkcs11", 3, 3},
		{"tpm", 3, 3},
	}
	for _, c := range cases {
		g, _ := testGate(0, c.maxQueue)
		g.slots = newSignerGate(c.maxQueue, time.Second, time.Now).slots
		g.observe(nil, nil, c.backend)
		if g.slots != c.want {
			t.Errorf("%s with bound %d: %d slots, want %d", c.backend, c.maxQueue, g.slots, c.want)
		}
	}
}
