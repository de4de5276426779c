package server

import (
	"container/list"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// trackedConn is an admitted connection; closing it frees its slot. The
// fields other than Conn, l, remote and sawStream are guarded by l.mu.
type trackedConn struct {
	net.Conn
	l         *connListener
	remote    *connAddr // RemoteAddr: carries the connection's identity into gRPC
	addr      netip.Addr
	accepted  time.Time
	groups    []netip.Prefix // the address and its prefixes
	known     bool           // the address passed a request recently
	sentData  bool           // sent its first bytes before it was accepted
	setUp     bool           // TLS and HTTP/2 set-up done
	state     string         // stateUnauthenticated, stateAuthenticated, stateIdle
	active    int            // authenticated requests in flight
	sawStream atomic.Bool    // a request stream began (set without l.mu)
	elem      *list.Element  // in the table's list for its state
	timer     *time.Timer
	gen       int // the current deadline; a timer of an older one does nothing
	once      sync.Once
}

// RemoteAddr is the peer's address, wrapped so that gRPC's per-stream
// and per-connection hooks can find this connection (see connOf).
func (c *trackedConn) RemoteAddr() net.Addr { return c.remote }

// armLocked replaces the connection's deadline: it is closed for reason
// in d unless the deadline is replaced or removed first.
func (c *trackedConn) armLocked(d time.Duration, reason string) {
	c.disarmLocked()
	gen := c.gen
	c.timer = time.AfterFunc(d, func() { c.expire(gen, reason) })
}

// disarmLocked removes the connection's deadline.
func (c *trackedConn) disarmLocked() {
	c.gen++
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
}

// expire closes the connection for reason if deadline gen is still the
// current one.
func (c *trackedConn) expire(gen int, reason string) {
	c.l.mu.Lock()
	open := c.gen == gen && c.l.untrackLocked(c)
	c.l.mu.Unlock()
	if open {
		c.l.metrics.connClosed(reason)
		_ = c.Conn.Close()
	}
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
	case c.state != stateUnauthenticated || c.sawStream.Load():
		return ""
	case !c.setUp:
		return abandonedHandshake
	default:
		return abandonedBeforeRequest
	}
}

// connAddr is a tracked connection's remote address. gRPC hands the
// connection's RemoteAddr to its hooks (peer, stats), never the
// connection: this is how they find it, by identity.
type connAddr struct {
	net.Addr
	conn *trackedConn
}

// connOf returns the tracked connection behind a peer address, or nil.
func connOf(a net.Addr) *trackedConn {
	if ca, ok := a.(*connAddr); ok {
		return ca.conn
	}
	return nil
}

// addrPortOf is a connection's remote address, IPv4-mapped IPv6
// addresses unmapped (a dual-stack socket reports IPv4 peers mapped).
func addrPortOf(a net.Addr) netip.AddrPort {
	if ca, ok := a.(*connAddr); ok {
		a = ca.Addr
	}
	if tcp, ok := a.(*net.TCPAddr); ok {
		return unmapped(tcp.AddrPort())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return unmapped(ap)
}

func unmapped(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
