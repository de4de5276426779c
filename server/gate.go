package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The signer gate stands between checked requests and the signing device.
// A TPM chip signs 5–50 times a second, so a fleet power-up queues far
// more requests than the device serves within a worker's 10 s attempt.
// The gate therefore:
//
//   - measures the device's service interval (busy time per completed
//     signature), which holds whether the device serializes or not;
//   - lines requests up in order of the first time their CSR was seen, so
//     that a worker retrying after a refusal keeps its place (first come,
//     first served across attempts, not a lottery among retries);
//   - hands the device only a request that, with the holders ahead of it,
//     finishes before its deadline (gRPC carries the client's): no
//     signature for a worker that already gave up;
//   - keeps a request whose turn will not come before its deadline
//     waiting anyway, in case the line ahead shrinks, and answers it
//     ResourceExhausted just before the deadline. Refusing it at once
//     would send the worker into its retry backoff (Talos: 1, 3, 7, 15,
//     31 s), so that it is away when its turn comes, and cost a TLS
//     handshake per attempt;
//   - refuses at once only a request that could not finish even at the
//     head of the line, and bounds holders plus waiters: beyond the bound
//     the youngest ticket is refused.

// saturatedError refuses a request because the signer cannot serve it
// before its deadline: ResourceExhausted, distinct from per-address limits
// (limitError) and from a failing device (signError).
type saturatedError struct{ reason string }

func (e *saturatedError) Error() string { return "signer saturated: " + e.reason }

// ewmaWeight is the weight of a new service-time sample: about the last
// 20 signatures.
const ewmaWeight = 0.05

// Ticket bounds: a Talos worker retries for about a minute, then starts
// over; a ticket outlives that.
const (
	ticketTTL        = 2 * time.Minute
	ticketsPerWaiter = 4
)

const (
	// A TPM executes one command at a time: a few requests at the signer
	// keep it busy even when the host is slow to wake the next one (swtpm
	// signs in about a millisecond), and the deadline check counts them
	// as work ahead. Other devices (HSMs with a session pool, a file key
	// on several cores) sign in parallel.
	serialSignerSlots   = 4
	parallelSignerSlots = 8 // signer/pkcs11's default session pool
	// The answer's way back to the worker, and scheduling delays.
	deliverySlackTime = 100 * time.Millisecond
)

// signerGate admits requests to the signer; see the comment above.
type signerGate struct {
	slots   int           // requests holding the signer at once
	max     int           // hard bound on holders plus waiters
	wait    time.Duration // deadline of requests that carry none
	now     func() time.Time
	log     *slog.Logger
	metrics *gateMetrics

	mu      sync.Mutex
	busy    int
	queue   []*waiter // by ticket, then arrival
	seq     uint64
	tickets ticketBook
	est     serviceEstimate
	state   saturation
}

type waiter struct {
	key      string
	ticket   time.Time
	seq      uint64
	deadline time.Time
	done     chan error // buffered; nil grants the signer, an error refuses
}

// before orders the queue: first seen first, then arrival.
func (w *waiter) before(o *waiter) bool {
	if !w.ticket.Equal(o.ticket) {
		return w.ticket.Before(o.ticket)
	}
	return w.seq < o.seq
}

func newSignerGate(maxQueue int, wait time.Duration, now func() time.Time) *signerGate {
	return &signerGate{
		slots: min(serialSignerSlots, maxQueue), max: maxQueue, wait: wait, now: now,
		log:     slog.New(slog.DiscardHandler),
		tickets: ticketBook{first: map[string]time.Time{}, max: ticketsPerWaiter * maxQueue, ttl: ticketTTL},
	}
}

// observe sends the gate's state changes to log and its gauges to m,
// and sizes the signer's slots to its backend ("tpm": serial).
func (g *signerGate) observe(log *slog.Logger, m *Metrics, backend string) {
	if backend != "tpm" {
		g.slots = min(max(runtime.GOMAXPROCS(0), parallelSignerSlots), g.max)
	}
	if log != nil {
		g.log = log
	}
	if m != nil {
		g.metrics = m.gate
	}
}

// lineKey identifies a worker across its attempts: its name and SANs.
// Talos keeps the CSR for a minute of attempts, then starts over with a
// new key, so the CSR's own digest would lose the worker's place.
func lineKey(r *Request) string {
	return r.Subject.CommonName + "\x00" + strings.Join(r.Requested, ",")
}

// acquireSigner waits for the signer in the gate's line; key identifies
// the request across retries (lineKey). The caller must call release once
// the device is done.
func (l *limiter) acquireSigner(ctx context.Context, key string) (release func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var deadline time.Time
	if d, ok := ctx.Deadline(); ok {
		// On the gate's clock, which tests may fake.
		deadline = l.gate.now().Add(time.Until(d))
	}
	return l.gate.acquire(ctx, key, deadline)
}

// acquire queues a request with deadline (zero: now + wait) and blocks
// until it holds the signer, is refused, or ctx ends.
func (g *signerGate) acquire(ctx context.Context, key string, deadline time.Time) (func(), error) {
	w, err := g.join(key, deadline)
	if err != nil {
		return nil, err
	}
	// Answer just before the deadline if the turn has not come by then.
	expire := time.NewTimer(w.deadline.Sub(g.now()) - deliverySlackTime)
	defer expire.Stop()
	select {
	case err := <-w.done:
		if err != nil {
			return nil, err
		}
		return g.releaser(), nil
	case <-expire.C:
		if _, err := g.abandon(w, &saturatedError{reason: "its turn did not come before its deadline; retry, its place in line is kept"}); err != nil {
			return nil, err
		}
		return g.releaser(), nil // granted at the last moment
	case <-ctx.Done():
		if _, err := g.abandon(w, ctx.Err()); err == nil {
			g.mu.Lock()
			g.releaseLocked(false) // granted meanwhile: pass the slot on unused
			g.mu.Unlock()
		}
		return nil, ctx.Err()
	}
}

// join admits a request into the queue (granting it the signer at once
// if a slot is free) or refuses it.
func (g *signerGate) join(key string, deadline time.Time) (*waiter, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if deadline.IsZero() {
		deadline = now.Add(g.wait)
	}
	w := &waiter{key: key, ticket: g.tickets.take(key, now), seq: g.seq, deadline: deadline, done: make(chan error, 1)}
	g.seq++
	err := g.enqueueLocked(now, w)
	if err == nil {
		g.dispatchLocked(now)
	}
	g.publishLocked()
	return w, err
}

// abandon takes a waiter out of the line with cause; if it was granted
// the signer or refused meanwhile, that outcome stands instead.
func (g *signerGate) abandon(w *waiter, cause error) (func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if i := slices.Index(g.queue, w); i >= 0 {
		g.queue = slices.Delete(g.queue, i, i+1)
		if isSaturatedErr(cause) {
			g.state.refused(g.log, len(g.queue), g.est.interval)
		}
		g.publishLocked()
		return nil, cause
	}
	if err := <-w.done; err != nil {
		return nil, err
	}
	return func() {}, nil
}

func isSaturatedErr(err error) bool {
	var sat *saturatedError
	return errors.As(err, &sat)
}

func (g *signerGate) releaser() func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.releaseLocked(true)
		})
	}
}

// releaseLocked frees a slot; signed says whether the device worked for
// it, which makes the time a service-time sample.
func (g *signerGate) releaseLocked(signed bool) {
	now := g.now()
	g.est.advance(now, g.busy)
	g.busy--
	if signed {
		g.est.complete()
	}
	g.dispatchLocked(now)
	g.publishLocked()
}

// enqueueLocked lines w up at its place, or refuses it when it could not
// finish even at the head of the line, or when the line is full and w's
// ticket is the youngest.
func (g *signerGate) enqueueLocked(now time.Time, w *waiter) error {
	if !g.fitsLocked(now, g.busy, w.deadline) {
		reason := fmt.Sprintf("its deadline is nearer than the %s the signer needs for it; retry with a longer deadline", g.est.workFor(g.busy+1).Round(time.Millisecond))
		if len(g.queue) == 0 {
			return &saturatedError{reason: reason} // one impatient client, not a saturated device
		}
		return g.refuseLocked(reason)
	}
	pos, _ := slices.BinarySearchFunc(g.queue, w, func(q, w *waiter) int {
		if q.before(w) {
			return -1
		}
		return 1
	})
	if g.busy+len(g.queue) >= g.max {
		full := fmt.Sprintf("%d requests hold or wait for the signer, the bound (TRUSTD_SIGNER_QUEUE); retry later, its place in line is kept", g.max)
		if pos == len(g.queue) {
			return g.refuseLocked(full)
		}
		last := g.queue[len(g.queue)-1]
		g.queue = g.queue[:len(g.queue)-1]
		last.done <- g.refuseLocked(full)
	}
	g.queue = slices.Insert(g.queue, pos, w)
	return nil
}

// fitsLocked reports whether a request with ahead requests before it
// finishes before deadline at the measured service interval, with a
// quarter more for a device that slows down (a busy host delays every
// TPM command) and the answer's way back.
func (g *signerGate) fitsLocked(now time.Time, ahead int, deadline time.Time) bool {
	work := g.est.workFor(ahead + 1)
	return !now.Add(work + work/4 + deliverySlackTime).After(deadline)
}

// dispatchLocked hands free slots to the queue's head, skipping requests
// that can no longer finish before their deadline.
func (g *signerGate) dispatchLocked(now time.Time) {
	for g.busy < g.slots && len(g.queue) > 0 {
		w := g.queue[0]
		g.queue[0] = nil
		g.queue = g.queue[1:]
		// Holders still ahead of it on a serial device (a TPM) count too.
		if !g.fitsLocked(now, g.busy, w.deadline) {
			w.done <- g.refuseLocked("its deadline passed while it waited; retry later")
			continue
		}
		g.est.advance(now, g.busy)
		g.busy++
		g.tickets.forget(w.key)
		w.done <- nil
	}
	if len(g.queue) == 0 && g.busy < g.slots {
		g.state.clear(g.log)
	}
}

func (g *signerGate) refuseLocked(reason string) error {
	g.state.refused(g.log, len(g.queue), g.est.interval)
	return &saturatedError{reason: reason}
}

func (g *signerGate) publishLocked() {
	g.metrics.set(len(g.queue), g.est.interval)
}

// stats is what tests and operators read: requests holding the signer,
// waiting, and the measured service interval.
func (g *signerGate) stats() (busy, queued int, interval time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.busy, len(g.queue), g.est.interval
}

// serviceEstimate measures the device's service interval: the time during
// which at least one request held the signer, divided among the requests
// that completed in it. A serial device (a TPM) with two holders still
// completes one request per signing time, and a parallel one (an HSM,
// a file key on several cores) completes several: the interval is right
// for both, unlike a mean holding time.
type serviceEstimate struct {
	interval   time.Duration // EWMA of busy time per completed request
	busyAccum  time.Duration // busy time since the last completion
	lastChange time.Time
}

// advance accounts for the time since the last change of the number of
// holders, busy, which is about to change.
func (e *serviceEstimate) advance(now time.Time, busy int) {
	if busy > 0 {
		e.busyAccum += now.Sub(e.lastChange)
	}
	e.lastChange = now
}

func (e *serviceEstimate) complete() {
	sample := e.busyAccum
	e.busyAccum = 0
	if e.interval == 0 {
		e.interval = sample
		return
	}
	e.interval += time.Duration(ewmaWeight * float64(sample-e.interval))
}

// workFor is the time n requests take at the measured interval; zero
// until the first signature (the gate then admits up to its bound).
func (e *serviceEstimate) workFor(n int) time.Duration {
	return time.Duration(n) * e.interval
}

// ticketBook remembers when each request key was first seen, bounded in
// entries and age, so that a retried request keeps its place in line.
type ticketBook struct {
	first     map[string]time.Time
	max       int
	ttl       time.Duration
	lastSweep time.Time
}

func (b *ticketBook) take(key string, now time.Time) time.Time {
	if key == "" {
		return now
	}
	if t, ok := b.first[key]; ok && now.Sub(t) < b.ttl {
		return t
	}
	if len(b.first) >= b.max && now.Sub(b.lastSweep) > b.ttl/8 {
		b.lastSweep = now
		for k, t := range b.first {
			if now.Sub(t) >= b.ttl {
				delete(b.first, k)
			}
		}
	}
	if len(b.first) < b.max {
		b.first[key] = now
	}
	return now
}

func (b *ticketBook) forget(key string) { delete(b.first, key) }

// saturation logs the gate's state once per change: saturated (requests
// refused because the device cannot serve them in time) or keeping up.
type saturation struct {
	on      bool
	refusal int // refusals in the current saturated episode
}

func (s *saturation) refused(log *slog.Logger, queued int, interval time.Duration) {
	s.refusal++
	if s.on {
		return
	}
	s.on = true
	log.Warn("signer saturated: refusing requests the device cannot serve before their deadline; workers retry, and their place in line is kept",
		"queued", queued, "service_interval", interval, "next", "if this lasts, use a faster signer or spread worker boots")
}

func (s *saturation) clear(log *slog.Logger) {
	if !s.on {
		return
	}
	log.Info("signer keeping up again", "refused", s.refusal)
	s.on, s.refusal = false, 0
}

// gateMetrics are the gate's collectors, registered by NewMetrics.
type gateMetrics struct {
	queued  prometheus.Gauge
	service prometheus.Gauge
	late    prometheus.Counter
}

func newGateMetrics(reg prometheus.Registerer) *gateMetrics {
	m := &gateMetrics{
		queued: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustd_signer_queued", Help: "Requests waiting in line for the signer.",
		}),
		service: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustd_signer_service_interval_seconds", Help: "Measured device time per certificate; with the queue it decides admission.",
		}),
		late: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustd_signatures_late_total", Help: "Signatures completed after the request's deadline had passed: device work wasted on a worker that gave up.",
		}),
	}
	reg.MustRegister(m.queued, m.service, m.late)
	return m
}

func (m *gateMetrics) set(queued int, interval time.Duration) {
	if m == nil {
		return
	}
	m.queued.Set(float64(queued))
	m.service.Set(interval.Seconds())
}

// observeLate counts a signature made (signErr nil) for a request whose
// deadline had passed by the time it completed.
func (m *Metrics) observeLate(ctx context.Context, signErr error) {
	if m != nil && signErr == nil && ctx.Err() != nil {
		m.gate.late.Inc()
	}
}
