package server

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"
)

// ConnLimits bound what a client can hold before it has shown the token.
// A worker dials, shakes hands and sends its CSR at once, so a connection
// that has not carried an authenticated request within seconds is not a
// worker. Zero values take the defaults documented on each field.
type ConnLimits struct {
	// MaxConnections bounds open connections (default 2048; a connection
	// through its TLS and HTTP/2 set-up costs ~40 KiB, see the README). At the cap, new
	// connections wait in the kernel's accept queue until a slot frees or
	// an unauthenticated connection has had its EvictionGrace.
	MaxConnections int
	// MaxUnauthenticated bounds connections that carry no request in
	// flight that passed the token and the request checks and have not
	// been served (default MaxConnections/2).
	// When full, a new connection evicts one of them: silent before those
	// that sent data, the busiest address and prefixes first, the oldest
	// first, never one younger than EvictionGrace.
	MaxUnauthenticated int
	// MaxPerAddress bounds open connections from one source address,
	// checked before any other slot is taken (default 64).
	MaxPerAddress int
	// MaxAuthenticatedPerPrefix bounds the authenticated connections of
	// each prefix of PrefixesV4/PrefixesV6 (default MaxConnections/2);
	// beyond it a request is still served, on a connection that stays
	// evictable.
	MaxAuthenticatedPerPrefix int
	// PrefixesV4 and PrefixesV6 are the prefix lengths over which
	// "busiest" is counted besides single addresses (default /24 and /16;
	// /64 and /48).
	PrefixesV4, PrefixesV6 []int
	// KnownWorkerReserve is the share of MaxUnauthenticated that
	// connections from unknown addresses cannot take: it is kept for
	// addresses whose requests passed within KnownWorkerTTL (default a
	// quarter).
	KnownWorkerReserve int
	// KnownWorkerTTL is how long an address stays known (default 25h: a
	// worker renews every 12 h).
	KnownWorkerTTL time.Duration
	// MaxKnownWorkers bounds the known addresses (default 65536).
	MaxKnownWorkers int
	// EvictionGrace is how long a new connection keeps its slot whatever
	// comes after it (default 2s): time for a worker a WAN away to finish
	// its handshake and send its request.
	EvictionGrace time.Duration
	// DeferAccept is how long the kernel holds a connection that has sent
	// nothing before handing it over (TCP_DEFER_ACCEPT, default 3s; < 0:
	// off); one handed over still silent is closed at once.
	DeferAccept time.Duration
	// HandshakeTimeout bounds the TLS and HTTP/2 set-up (default 5s).
	HandshakeTimeout time.Duration
	// AuthTimeout closes a connection that has not carried an
	// authenticated request this long after it was accepted (default 10s).
	AuthTimeout time.Duration
	// RequestIdleTimeout is how long a connection without a request in
	// flight may stay (default 2s: sooner than AuthTimeout, since a token
	// is no lease on a slot): gRPC sends it a GOAWAY then, and the
	// listener closes a served one that is still open twice as long after
	// its last request.
	RequestIdleTimeout time.Duration
	// FirstMessageTimeout resets a stream whose request message has not
	// arrived this long after its headers (default 2s).
	FirstMessageTimeout time.Duration
	// IdleTimeout closes a connection without streams (default 30s).
	IdleTimeout time.Duration
	// MaxAgeGrace is how long streams may finish once a connection reaches
	// its maximum age of 10 minutes (default 10s).
	MaxAgeGrace time.Duration
	// MaxHeaderBytes bounds the header list of a request (default 8 KiB).
	MaxHeaderBytes int
}

func (c ConnLimits) withDefaults() ConnLimits {
	setDefault(&c.MaxConnections, 2048)
	setDefault(&c.MaxUnauthenticated, max(c.MaxConnections/2, 1))
	c.MaxUnauthenticated = min(c.MaxUnauthenticated, c.MaxConnections)
	setDefault(&c.MaxPerAddress, 64)
	setDefault(&c.MaxAuthenticatedPerPrefix, max(c.MaxConnections/2, 1))
	if c.PrefixesV4 == nil {
		c.PrefixesV4 = []int{24, 16}
	}
	if c.PrefixesV6 == nil {
		c.PrefixesV6 = []int{64, 48}
	}
	setDefault(&c.KnownWorkerReserve, c.MaxUnauthenticated/4)
	c.KnownWorkerReserve = min(c.KnownWorkerReserve, c.MaxUnauthenticated-1)
	setDefault(&c.KnownWorkerTTL, 25*time.Hour)
	setDefault(&c.MaxKnownWorkers, 65536)
	setDefault(&c.EvictionGrace, 2*time.Second)
	if c.DeferAccept == 0 {
		c.DeferAccept = 3 * time.Second
	}
	setDefault(&c.HandshakeTimeout, 5*time.Second)
	setDefault(&c.AuthTimeout, 10*time.Second)
	setDefault(&c.RequestIdleTimeout, 2*time.Second)
	setDefault(&c.FirstMessageTimeout, 2*time.Second)
	setDefault(&c.IdleTimeout, 30*time.Second)
	setDefault(&c.MaxAgeGrace, 10*time.Second)
	setDefault(&c.MaxHeaderBytes, 8<<10)
	return c
}

func setDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// Reasons a connection is refused or closed by a limit; the label of
// trustd_connections_refused_total and trustd_connections_closed_total.
const (
	closedPerAddress   = "per_address"
	closedNoData       = "no_data" // handed over by the kernel without a byte sent
	closedNoRoom       = "no_room" // every slot turned young or authenticated between the wait and the accept
	closedEvicted      = "unauthenticated_evicted"
	closedAuthTimeout  = "auth_timeout"
	closedHandshake    = "handshake_timeout"
	closedRequestIdle  = "request_idle_timeout"
	closedFirstMessage = "first_message_timeout"
	closedNotReady     = "signer_not_ready"
)

// Stages at which unauthenticated connections end without a request; the
// label of trustd_connections_abandoned_total.
const (
	abandonedHandshake     = "handshake"
	abandonedBeforeRequest = "before_request"
)

// Kinds of accept failure; the label of trustd_accept_errors_total.
const (
	acceptFDExhausted = "fd_exhausted"
	acceptOther       = "other"
)

// acceptErrorKind names an accept error: out of file descriptors (EMFILE,
// ENFILE) or anything else.
func acceptErrorKind(err error) string {
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
		return acceptFDExhausted
	}
	return acceptOther
}

// Front-door states: the label of trustd_front_door_state and the key of
// their log lines.
const (
	frontEvicting        = "evicting"
	frontConnectionsFull = "connections_full"
	frontAcceptFailing   = "accept_failing"
)

// frontStates are the front-door states.
func frontStates() []string { return []string{frontEvicting, frontConnectionsFull, frontAcceptFailing} }

// errListenerClosed is returned by Accept once the listener is closed.
var errListenerClosed = errors.New("listener closed")

// connListener admits connections under ConnLimits. One goroutine accepts
// from the socket and applies the limits; gRPC servers take admitted
// connections through views (see View), so that a server can be replaced
// (to send GOAWAY on every open connection) without closing the socket.
type connListener struct {
	inner   net.Listener
	cfg     ConnLimits
	metrics *Metrics
	state   *stateLog
	now     func() time.Time
	// silent reports a connection that has sent nothing yet; deferring
	// is set when the kernel holds such connections back (DeferAccept),
	// so that every admitted one has sent its first bytes.
	silent    func(net.Conn) bool
	deferring bool

	admitted chan net.Conn
	done     chan struct{}
	room     chan struct{} // a slot may have freed
	stopOnce sync.Once

	mu           sync.Mutex
	table        *connTable
	closed       bool
	acceptErr    error
	lastEviction time.Time
	// waitSince is when the accept loop started leaving connections in
	// the kernel's queue (every slot taken), failSince when accepting
	// started failing; zero while fine.
	waitSince, failSince time.Time
	// stuckGrace is how long either may last before the listener reports
	// that it cannot take workers (default 10s): a fleet power-up fills
	// the slots for moments, which is no reason to leave the Service.
	stuckGrace time.Duration
}

// newConnListener wraps inner. Run must be called for connections to flow.
func newConnListener(inner net.Listener, cfg ConnLimits, m *Metrics, st *stateLog) *connListener {
	cfg = cfg.withDefaults()
	l := &connListener{
		inner: inner, cfg: cfg, metrics: m, state: st, now: time.Now,
		stuckGrace: 10 * time.Second,
		admitted:   make(chan net.Conn),
		done:       make(chan struct{}),
		room:       make(chan struct{}, 1),
		table:      newConnTable(cfg),
		silent:     func(net.Conn) bool { return false },
	}
	if cfg.DeferAccept > 0 && deferAccept(inner, cfg.DeferAccept) == nil {
		l.silent, l.deferring = silentConn, true
	}
	m.setConnLimits(l.cfg)
	return l
}

// Addr is the socket's address.
func (l *connListener) Addr() net.Addr { return l.inner.Addr() }

// Run accepts and admits connections until the listener is closed; it
// returns the socket's error, or nil after Close.
func (l *connListener) Run() error {
	for l.waitForRoom() {
		c, err := l.inner.Accept()
		if err != nil {
			if l.retryAccept(err) {
				continue
			}
			return l.acceptFailed(err)
		}
		l.acceptRecovered()
		if tc := l.admit(c); tc != nil {
			select {
			case l.admitted <- tc:
			case <-l.done:
				_ = tc.Close()
				return nil
			}
		}
	}
	return nil
}

// waitForRoom leaves new connections in the kernel's accept queue while
// no slot can be had: every slot is held by an authenticated connection,
// or the unauthenticated ones are all younger than EvictionGrace (a
// connection already accepted keeps its chance to send its token). It
// reports false once the listener is closed.
func (l *connListener) waitForRoom() bool {
	for {
		l.mu.Lock()
		d := l.table.wait(l.now())
		closed := l.closed
		l.setWaitingLocked(d != 0 && !closed)
		l.mu.Unlock()
		if closed || d == 0 {
			return !closed
		}
		l.sleep(d)
	}
}

// sleep waits for a freed slot, the end of the listener, or d (d < 0:
// no time limit).
func (l *connListener) sleep(d time.Duration) {
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-l.room:
	case <-timeout:
	case <-l.done:
	}
}

func (l *connListener) setWaitingLocked(waiting bool) {
	switch {
	case !waiting:
		l.waitSince = time.Time{}
	case l.waitSince.IsZero():
		l.waitSince = l.now()
	}
	l.state.set(frontConnectionsFull, waiting, "every connection slot is taken; new connections wait in the kernel's accept queue (raise TRUSTD_MAX_CONNECTIONS if this lasts)")
}

// freed wakes the accept loop: a slot may have become free.
func (l *connListener) freed() {
	select {
	case l.room <- struct{}{}:
	default:
	}
}

// retryAccept waits a little after a temporary accept error (EMFILE:
// out of file descriptors) and reports whether to try again, as
// net/http and gRPC do; the socket itself is still fine.
func (l *connListener) retryAccept(err error) bool {
	var te interface{ Temporary() bool }
	if !errors.As(err, &te) || !te.Temporary() {
		return false
	}
	l.metrics.acceptFailed(acceptErrorKind(err))
	l.mu.Lock()
	if l.failSince.IsZero() {
		l.failSince = l.now()
	}
	l.mu.Unlock()
	l.state.set(frontAcceptFailing, true, "accepting connections fails: out of file descriptors (raise LimitNOFILE, or lower TRUSTD_MAX_CONNECTIONS); retrying")
	select {
	case <-l.done:
		return false
	case <-time.After(50 * time.Millisecond):
		return true
	}
}

func (l *connListener) acceptRecovered() {
	l.mu.Lock()
	l.failSince = time.Time{}
	l.mu.Unlock()
	l.state.set(frontAcceptFailing, false, "accepting connections fails: out of file descriptors (raise LimitNOFILE, or lower TRUSTD_MAX_CONNECTIONS); retrying")
}

func (l *connListener) acceptFailed(err error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.acceptErr = err
	return err
}

// admit closes a connection that has sent nothing, applies the
// per-address cap, then makes room, and starts the connection's deadline.
func (l *connListener) admit(c net.Conn) *trackedConn {
	if l.silent(c) {
		l.refuse(c, closedNoData, "connections closed: handed over by the kernel after TRUSTD_DEFER_ACCEPT without a byte sent", nil)
		return nil
	}
	ap := addrPortOf(c.RemoteAddr())
	l.mu.Lock()
	if l.table.perAddress(ap.Addr()) >= l.cfg.MaxPerAddress {
		l.mu.Unlock()
		l.refuse(c, closedPerAddress, "connections refused: an address reached TRUSTD_MAX_CONNECTIONS_PER_ADDRESS", []any{"address", ap.Addr().String()})
		return nil
	}
	now := l.now()
	victim, refuse := l.table.victim(ap.Addr(), now)
	if refuse {
		l.mu.Unlock()
		l.refuse(c, closedNoRoom, "connections refused: no slot could be freed for them (every connection is younger than TRUSTD_EVICTION_GRACE, carries a request, or is a known worker's within TRUSTD_KNOWN_WORKER_RESERVE); raise TRUSTD_MAX_CONNECTIONS if this lasts", nil)
		return nil
	}
	reason := l.dropLocked(victim)
	tc := l.trackLocked(c, ap, now)
	l.mu.Unlock()
	if victim != nil {
		l.metrics.connClosed(reason)
		l.state.event(reason, "connection limit reached: evicting unauthenticated connections (silent first, then the busiest addresses and prefixes)")
		_ = victim.Conn.Close()
	}
	return tc
}

// refuse closes c at once for reason; counted before the close, so that
// the refusal is visible by the time the client sees it.
func (l *connListener) refuse(c net.Conn, reason, msg string, attrs []any) {
	l.metrics.connRefused(reason)
	l.state.event(reason, msg, attrs...)
	_ = c.Close()
}

// dropLocked forgets victim (if any) so that its slot is free for the
// newcomer, and names why it goes.
func (l *connListener) dropLocked(victim *trackedConn) string {
	if victim == nil {
		return ""
	}
	l.lastEviction = l.now()
	l.untrackLocked(victim)
	return closedEvicted
}

func (l *connListener) trackLocked(c net.Conn, ap netip.AddrPort, now time.Time) *trackedConn {
	tc := &trackedConn{Conn: c, l: l, addr: ap.Addr(), accepted: now, sentData: l.deferring}
	tc.remote = &connAddr{Addr: c.RemoteAddr(), conn: tc}
	l.table.add(tc, now)
	tc.armLocked(l.cfg.HandshakeTimeout, closedHandshake)
	l.metrics.connMoved("", stateUnauthenticated)
	return tc
}

// untrackLocked forgets tc; it reports false if it was already gone.
func (l *connListener) untrackLocked(tc *trackedConn) bool {
	state := tc.state
	if !l.table.remove(tc) {
		return false
	}
	tc.disarmLocked()
	l.metrics.connMoved(state, "")
	l.freed()
	return true
}

// established records that tc finished its TLS and HTTP/2 set-up: its
// deadline becomes the authentication deadline.
func (l *connListener) established(tc *trackedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if tc.state == stateUnauthenticated && !tc.setUp {
		tc.setUp = true
		left := l.cfg.AuthTimeout - l.now().Sub(tc.accepted)
		tc.armLocked(max(left, 0), closedAuthTimeout)
	}
}

// streamStarted records a request stream on tc. It runs in the
// connection's HTTP/2 reader for every request, so it takes no lock: the
// listener's mutex was the most contended one under load (see
// docs/performance.md), and only "any stream yet" is ever asked.
func (l *connListener) streamStarted(tc *trackedConn) {
	if !tc.sawStream.Load() {
		tc.sawStream.Store(true)
	}
}

// requestStarted records that tc carries a request that passed the token
// and the request checks; it reports whether tc counts as authenticated
// for it (requestEnded must then follow).
func (l *connListener) requestStarted(tc *trackedConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	from := tc.state
	if !l.table.requestStarted(tc, l.now()) {
		return false
	}
	if from != stateAuthenticated {
		tc.disarmLocked()
		l.metrics.connMoved(from, stateAuthenticated)
	}
	return true
}

// requestEnded records the end of such a request: after the last one, tc
// is idle; gRPC sends a GOAWAY after RequestIdleTimeout, and the listener
// closes it if it is still open after twice that.
func (l *connListener) requestEnded(tc *trackedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.table.requestEnded(tc) {
		l.metrics.connMoved(stateAuthenticated, stateIdle)
		tc.armLocked(2*l.cfg.RequestIdleTimeout, closedRequestIdle)
		l.freed()
	}
}

// closeUnauthenticated closes tc for reason if it is open and not
// authenticated (a request in flight is never cut by these limits).
func (l *connListener) closeUnauthenticated(tc *trackedConn, reason string) {
	l.mu.Lock()
	open := tc.state != stateAuthenticated && l.untrackLocked(tc)
	l.mu.Unlock()
	if open {
		l.metrics.connClosed(reason)
		_ = tc.Conn.Close()
	}
}

// open is the number of open connections.
func (l *connListener) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.table.conns)
}

// evictingWindow: evictions count as going on while the last one is
// this recent, so that a sustained flood is one episode.
const evictingWindow = 10 * time.Second

// Sweep publishes whether evictions are going on (one state change per
// episode in the log; the counter has every eviction).
func (l *connListener) Sweep() {
	l.mu.Lock()
	on := !l.lastEviction.IsZero() && l.now().Sub(l.lastEviction) < evictingWindow
	l.mu.Unlock()
	l.state.set(frontEvicting, on, "unauthenticated connections are being evicted for newcomers: a flood of connections that do not authenticate (see trustd_connections_closed_total)")
}

// Check reports why the listener cannot take workers now, or nil.
func (l *connListener) Check() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	switch {
	case l.acceptErr != nil:
		return errors.New("listener failed: " + l.acceptErr.Error())
	case !l.failSince.IsZero() && now.Sub(l.failSince) >= l.stuckGrace:
		return fmt.Errorf("accepting connections has failed for %v: out of file descriptors (raise LimitNOFILE)", now.Sub(l.failSince).Round(time.Second))
	case !l.waitSince.IsZero() && now.Sub(l.waitSince) >= l.stuckGrace:
		return fmt.Errorf("every connection slot has been taken for %v, new connections wait (TRUSTD_MAX_CONNECTIONS)", now.Sub(l.waitSince).Round(time.Second))
	}
	return nil
}

// Close stops accepting, closes the socket and wakes every view.
func (l *connListener) Close() error {
	var err error
	l.stopOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		close(l.done)
		err = l.inner.Close()
	})
	return err
}

// View returns a net.Listener for one gRPC server: its Close ends only
// that server's Accept, never the socket.
func (l *connListener) View() net.Listener {
	return &listenerView{l: l, done: make(chan struct{})}
}

type listenerView struct {
	l    *connListener
	done chan struct{}
	once sync.Once
}

func (v *listenerView) Accept() (net.Conn, error) {
	select {
	case c := <-v.l.admitted:
		return c, nil
	case <-v.done:
		return nil, errListenerClosed
	case <-v.l.done:
		return nil, errListenerClosed
	}
}

func (v *listenerView) Close() error   { v.once.Do(func() { close(v.done) }); return nil }
func (v *listenerView) Addr() net.Addr { return v.l.Addr() }
