package server

import (
	"container/list"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// ConnLimits bound what a client can hold before it has shown the token.
// A worker dials, shakes hands and sends its CSR at once, so a connection
// that has not carried an authenticated request within seconds is not a
// worker. Zero values take the defaults documented on each field.
type ConnLimits struct {
	// MaxConnections bounds open connections (default 256). When every
	// one has authenticated, further ones wait in the kernel's accept
	// queue.
	MaxConnections int
	// MaxUnauthenticated bounds connections that have not yet carried a
	// request with a valid token (default MaxConnections/2). When full, a
	// new connection evicts the oldest unauthenticated connection of the
	// address that holds the most, so a flood from some addresses cannot
	// crowd out a worker on another.
	MaxUnauthenticated int
	// MaxPerAddress bounds open connections from one source address,
	// checked before any other slot is taken (default 64).
	MaxPerAddress int
	// HandshakeTimeout bounds the TLS and HTTP/2 set-up (default 5s).
	HandshakeTimeout time.Duration
	// AuthTimeout closes a connection that has not carried a request with
	// a valid token this long after it was accepted (default 10s).
	AuthTimeout time.Duration
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
	setDefault(&c.MaxConnections, 256)
	setDefault(&c.MaxUnauthenticated, max(c.MaxConnections/2, 1))
	c.MaxUnauthenticated = min(c.MaxUnauthenticated, c.MaxConnections)
	setDefault(&c.MaxPerAddress, 64)
	setDefault(&c.HandshakeTimeout, 5*time.Second)
	setDefault(&c.AuthTimeout, 10*time.Second)
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
// trustd_connections_closed_total.
const (
	closedPerAddress   = "per_address"
	closedEvicted      = "unauthenticated_evicted"
	closedAuthTimeout  = "auth_timeout"
	closedHandshake    = "handshake_timeout"
	closedFirstMessage = "first_message_timeout"
	closedNotReady     = "signer_not_ready"
)

// Stages at which unauthenticated connections end without a request; the
// label of trustd_connections_abandoned_total.
const (
	abandonedHandshake     = "handshake"
	abandonedBeforeRequest = "before_request"
)

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

	admitted chan net.Conn
	done     chan struct{}
	stopOnce sync.Once

	mu         sync.Mutex
	room       *sync.Cond
	conns      map[netip.AddrPort]*trackedConn
	perAddr    map[netip.Addr]*addrCount
	unauth     *list.List // of *trackedConn, oldest first
	closed     bool
	acceptErr  error
	waitingAll bool // every slot is held by an authenticated connection
	// stuckSince is when new connections started waiting (all slots
	// authenticated) or accepting started failing; zero while fine.
	stuckSince time.Time
	// stuckGrace is how long that may last before the listener reports
	// that it cannot take workers (default 10s): a fleet power-up fills
	// the slots for moments, which is no reason to leave the Service.
	stuckGrace time.Duration
}

type addrCount struct{ total, unauth int }

// newConnListener wraps inner. Run must be called for connections to flow.
func newConnListener(inner net.Listener, cfg ConnLimits, m *Metrics, st *stateLog) *connListener {
	l := &connListener{
		inner: inner, cfg: cfg.withDefaults(), metrics: m, state: st, now: time.Now,
		stuckGrace: 10 * time.Second,
		admitted:   make(chan net.Conn),
		done:       make(chan struct{}),
		conns:      map[netip.AddrPort]*trackedConn{},
		perAddr:    map[netip.Addr]*addrCount{},
		unauth:     list.New(),
	}
	l.room = sync.NewCond(&l.mu)
	m.setConnLimits(l.cfg)
	return l
}

// Addr is the socket's address.
func (l *connListener) Addr() net.Addr { return l.inner.Addr() }

// Run accepts and admits connections until the listener is closed; it
// returns the socket's error, or nil after Close.
func (l *connListener) Run() error {
	for {
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
				tc.Close()
				return nil
			}
		}
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
	l.mu.Lock()
	l.setStuckLocked(true)
	l.mu.Unlock()
	l.state.set("accept_failing", true, "accepting connections fails (out of file descriptors?); retrying")
	select {
	case <-l.done:
		return false
	case <-time.After(50 * time.Millisecond):
		return true
	}
}

func (l *connListener) acceptRecovered() {
	l.mu.Lock()
	l.setStuckLocked(l.waitingAll)
	l.mu.Unlock()
	l.state.set("accept_failing", false, "accepting connections fails (out of file descriptors?); retrying")
}

// setStuckLocked starts or ends a period in which new connections cannot
// be taken.
func (l *connListener) setStuckLocked(stuck bool) {
	switch {
	case !stuck:
		l.stuckSince = time.Time{}
	case l.stuckSince.IsZero():
		l.stuckSince = l.now()
	}
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

// waitForRoomLocked blocks while every slot is held by an authenticated
// connection: those are workers being served, and end within seconds.
// Meanwhile further connections wait in the kernel's accept queue. It
// reports false if the listener was closed.
func (l *connListener) waitForRoomLocked() bool {
	for !l.closed && l.fullLocked() {
		l.setWaitingAll(true)
		l.room.Wait()
	}
	l.setWaitingAll(false)
	return !l.closed
}

func (l *connListener) fullLocked() bool {
	return len(l.conns) >= l.cfg.MaxConnections && l.unauth.Len() == 0
}

func (l *connListener) setWaitingAll(v bool) {
	if l.waitingAll != v {
		l.waitingAll = v
		l.setStuckLocked(v)
		l.state.set("connections_full", v, "every connection slot is held by an authenticated worker; new connections wait in the kernel's accept queue (raise TRUSTD_MAX_CONNECTIONS if this lasts)")
	}
}

// admit applies the per-address cap, then makes room among the
// unauthenticated connections, and starts the connection's deadline.
func (l *connListener) admit(c net.Conn) *trackedConn {
	ap := addrPortOf(c.RemoteAddr())
	l.mu.Lock()
	pa := l.perAddr[ap.Addr()]
	if pa != nil && pa.total >= l.cfg.MaxPerAddress {
		l.mu.Unlock()
		// Counted before the close, so that the refusal is visible by the
		// time the client sees it.
		l.metrics.connRefused(closedPerAddress)
		l.state.event(closedPerAddress, "connections refused: an address reached TRUSTD_MAX_CONNECTIONS_PER_ADDRESS", "address", ap.Addr().String())
		c.Close()
		return nil
	}
	if !l.waitForRoomLocked() {
		l.mu.Unlock()
		c.Close()
		return nil
	}
	var victim *trackedConn
	if l.unauth.Len() >= l.cfg.MaxUnauthenticated || len(l.conns) >= l.cfg.MaxConnections {
		victim = l.victimLocked()
	}
	tc := l.trackLocked(c, ap)
	l.mu.Unlock()
	if victim != nil {
		victim.closeFor(closedEvicted)
		l.state.event(closedEvicted, "unauthenticated connection limit reached: evicting the oldest unauthenticated connections of the busiest addresses")
	}
	return tc
}

// victimLocked picks the oldest unauthenticated connection of the address
// holding the most of them, and forgets it at once so that its slot is
// free for the new connection.
func (l *connListener) victimLocked() *trackedConn {
	var busiest netip.Addr
	most := 0
	for a, pa := range l.perAddr {
		if pa.unauth > most {
			busiest, most = a, pa.unauth
		}
	}
	for e := l.unauth.Front(); e != nil; e = e.Next() {
		if tc := e.Value.(*trackedConn); most <= 1 || tc.key.Addr() == busiest {
			l.untrackLocked(tc)
			return tc
		}
	}
	return nil
}

func (l *connListener) trackLocked(c net.Conn, ap netip.AddrPort) *trackedConn {
	tc := &trackedConn{Conn: c, l: l, key: ap, accepted: l.now()}
	tc.elem = l.unauth.PushBack(tc)
	l.conns[ap] = tc
	pa := l.perAddr[ap.Addr()]
	if pa == nil {
		pa = &addrCount{}
		l.perAddr[ap.Addr()] = pa
	}
	pa.total++
	pa.unauth++
	tc.timer = time.AfterFunc(l.cfg.HandshakeTimeout, func() { tc.closeFor(closedHandshake) })
	l.metrics.connOpened()
	return tc
}

// untrackLocked forgets tc; it reports false if it was already gone.
func (l *connListener) untrackLocked(tc *trackedConn) bool {
	if l.conns[tc.key] != tc {
		return false
	}
	delete(l.conns, tc.key)
	l.leaveUnauthLocked(tc)
	pa := l.perAddr[tc.key.Addr()]
	pa.total--
	if pa.total == 0 {
		delete(l.perAddr, tc.key.Addr())
	}
	tc.timer.Stop()
	l.metrics.connGone(tc.authenticated)
	l.room.Signal()
	return true
}

// unauthenticatedLocked returns the open, not yet authenticated
// connection from ap, or nil.
func (l *connListener) unauthenticatedLocked(ap netip.AddrPort) *trackedConn {
	tc := l.conns[unmapped(ap)]
	if tc == nil || tc.authenticated {
		return nil
	}
	return tc
}

// established records that the connection from ap finished its TLS and
// HTTP/2 set-up: its deadline becomes the authentication deadline.
func (l *connListener) established(ap netip.AddrPort) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if tc := l.unauthenticatedLocked(ap); tc != nil {
		tc.setUp = true
		tc.timer.Stop()
		left := l.cfg.AuthTimeout - l.now().Sub(tc.accepted)
		tc.timer = time.AfterFunc(max(left, 0), func() { tc.closeFor(closedAuthTimeout) })
	}
}

// streamStarted records a request stream on the connection from ap.
func (l *connListener) streamStarted(ap netip.AddrPort) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if tc := l.conns[unmapped(ap)]; tc != nil {
		tc.streams++
	}
}

// authenticated records that the connection from ap carried a request
// with a valid token: it leaves the unauthenticated budget for good.
func (l *connListener) authenticated(ap netip.AddrPort) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if tc := l.unauthenticatedLocked(ap); tc != nil {
		tc.timer.Stop()
		l.leaveUnauthLocked(tc)
		tc.authenticated = true
		l.metrics.connAuthenticated()
	}
}

// leaveUnauthLocked takes tc out of the unauthenticated budget.
func (l *connListener) leaveUnauthLocked(tc *trackedConn) {
	if tc.elem != nil {
		l.unauth.Remove(tc.elem)
		tc.elem = nil
		l.perAddr[tc.key.Addr()].unauth--
	}
}

// closeUnauthenticated closes the connection from ap for reason, if it is
// open and not authenticated (a worker's connection is never cut by these
// limits).
func (l *connListener) closeUnauthenticated(ap netip.AddrPort, reason string) {
	l.mu.Lock()
	tc := l.unauthenticatedLocked(ap)
	l.mu.Unlock()
	if tc != nil {
		tc.closeFor(reason)
	}
}

// open is the number of open connections.
func (l *connListener) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// Check reports why the listener cannot take workers now, or nil.
func (l *connListener) Check() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.acceptErr != nil:
		return errors.New("listener failed: " + l.acceptErr.Error())
	case !l.stuckSince.IsZero() && l.now().Sub(l.stuckSince) >= l.stuckGrace:
		if l.waitingAll {
			return fmt.Errorf("every connection slot has been held by authenticated workers for %v (TRUSTD_MAX_CONNECTIONS)", l.now().Sub(l.stuckSince).Round(time.Second))
		}
		return fmt.Errorf("accepting connections has failed for %v (out of file descriptors?)", l.now().Sub(l.stuckSince).Round(time.Second))
	}
	return nil
}

// Close stops accepting, closes the socket and wakes every view.
func (l *connListener) Close() error {
	var err error
	l.stopOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		l.room.Broadcast()
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

// trackedConn is an admitted connection; closing it frees its slot.
type trackedConn struct {
	net.Conn
	l             *connListener
	key           netip.AddrPort
	accepted      time.Time
	elem          *list.Element // in l.unauth while unauthenticated
	authenticated bool
	setUp         bool // TLS and HTTP/2 set-up done
	streams       int  // request streams seen
	timer         *time.Timer
	once          sync.Once
}

// Close frees the slot and closes the socket.
func (c *trackedConn) Close() error {
	var err error
	c.once.Do(func() {
		c.l.mu.Lock()
		stage := ""
		if c.l.untrackLocked(c) {
			stage = c.abandonedLocked()
		}
		c.l.mu.Unlock()
		if stage != "" {
			c.l.metrics.connAbandoned(stage)
		}
		err = c.Conn.Close()
	})
	return err
}

// abandonedLocked names how an unauthenticated connection that ends
// without any request ended (by the client, or by gRPC for a protocol
// violation such as a header list far over the bound): "handshake" or
// "before_request"; "" for any other connection.
func (c *trackedConn) abandonedLocked() string {
	switch {
	case c.authenticated || c.streams > 0:
		return ""
	case !c.setUp:
		return abandonedHandshake
	default:
		return abandonedBeforeRequest
	}
}

// closeFor closes the connection because of a limit and counts it; a
// connection already closed is not counted.
func (c *trackedConn) closeFor(reason string) {
	c.l.mu.Lock()
	if c.authenticated {
		c.l.mu.Unlock()
		return // a timer that fired as the worker authenticated
	}
	open := c.l.untrackLocked(c)
	c.l.mu.Unlock()
	if open || reason == closedEvicted {
		c.l.metrics.connClosed(reason)
	}
	c.Close()
}

// addrPortOf is a connection's remote address, IPv4-mapped IPv6
// addresses unmapped (a dual-stack socket reports IPv4 peers mapped).
func addrPortOf(a net.Addr) netip.AddrPort {
	if tcp, ok := a.(*net.TCPAddr); ok {
		return unmapped(tcp.AddrPort())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return unmapped(ap)
}

func unmapped(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
