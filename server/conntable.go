package server

import (
	"container/list"
	"net/netip"
	"time"
)

// Connection states; the label of trustd_connections_open.
const (
	stateUnauthenticated = "unauthenticated" // no request has passed the token and request checks yet
	stateAuthenticated   = "authenticated"   // carrying a request that passed them
	stateIdle            = "idle"            // served; no request in flight
)

// connTable is the accounting of open connections: bookkeeping only (no
// I/O, no timers), called under the listener's lock. Connections are
// tracked by identity, never by address and port, so that a client that
// resets and reconnects from the same port cannot make two connections
// share (or lose) an entry.
type connTable struct {
	cfg    ConnLimits
	known  *knownWorkers
	conns  map[*trackedConn]struct{}
	groups map[netip.Prefix]*groupCount
	unauth *list.List // unauthenticated connections, oldest first
	idle   *list.List // served connections without a request, oldest first

	authenticated int
	unknownUnauth int // unauthenticated connections from addresses not known as workers
}

// groupCount counts the connections of one address or prefix.
type groupCount struct{ total, unauth, auth int }

func newConnTable(cfg ConnLimits) *connTable {
	return &connTable{
		cfg: cfg, known: newKnownWorkers(cfg.MaxKnownWorkers, cfg.KnownWorkerTTL),
		conns: map[*trackedConn]struct{}{}, groups: map[netip.Prefix]*groupCount{},
		unauth: list.New(), idle: list.New(),
	}
}

// groupsOf are the address itself and its configured prefixes.
func (t *connTable) groupsOf(a netip.Addr) []netip.Prefix {
	bits := t.cfg.PrefixesV4
	if !a.Is4() {
		bits = t.cfg.PrefixesV6
	}
	out := make([]netip.Prefix, 0, len(bits)+1)
	out = append(out, netip.PrefixFrom(a, a.BitLen()))
	for _, b := range bits {
		if p, err := a.Prefix(b); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// perAddress is the number of open connections from a.
func (t *connTable) perAddress(a netip.Addr) int {
	if g := t.groups[netip.PrefixFrom(a, a.BitLen())]; g != nil {
		return g.total
	}
	return 0
}

// add tracks tc as a new unauthenticated connection.
func (t *connTable) add(tc *trackedConn, now time.Time) {
	tc.groups = t.groupsOf(tc.addr)
	tc.known = t.known.has(tc.addr, now)
	tc.state = stateUnauthenticated
	tc.elem = t.unauth.PushBack(tc)
	if !tc.known {
		t.unknownUnauth++
	}
	t.conns[tc] = struct{}{}
	for _, p := range tc.groups {
		g := t.groups[p]
		if g == nil {
			g = &groupCount{}
			t.groups[p] = g
		}
		g.total++
		g.unauth++
	}
}

// remove forgets tc; it reports false if tc was not tracked (already
// removed), so that every close path releases a slot exactly once.
func (t *connTable) remove(tc *trackedConn) bool {
	if _, ok := t.conns[tc]; !ok {
		return false
	}
	t.leave(tc)
	delete(t.conns, tc)
	for _, p := range tc.groups {
		g := t.groups[p]
		if g.total--; g.total == 0 {
			delete(t.groups, p)
		}
	}
	return true
}

// leave takes tc out of its state's accounting (not out of the table).
func (t *connTable) leave(tc *trackedConn) {
	switch tc.state {
	case stateUnauthenticated:
		t.unauth.Remove(tc.elem)
		if !tc.known {
			t.unknownUnauth--
		}
		t.addGroups(tc, -1, 0)
	case stateIdle:
		t.idle.Remove(tc.elem)
	case stateAuthenticated:
		t.authenticated--
		t.addGroups(tc, 0, -1)
	}
	tc.elem = nil
}

func (t *connTable) addGroups(tc *trackedConn, unauth, auth int) {
	for _, p := range tc.groups {
		g := t.groups[p]
		g.unauth += unauth
		g.auth += auth
	}
}

// requestStarted records a request on tc that passed the token and the
// request checks. The connection counts as authenticated while it
// carries such requests, within MaxAuthenticatedPerPrefix for each of its
// prefixes; it reports whether this request made or kept it so (a
// request beyond the bound is still served, on a connection that stays
// evictable). The address becomes a known worker.
func (t *connTable) requestStarted(tc *trackedConn, now time.Time) bool {
	if _, ok := t.conns[tc]; !ok {
		return false
	}
	t.known.add(tc.addr, now)
	if tc.state == stateAuthenticated {
		tc.active++
		return true
	}
	if !t.authRoom(tc) {
		return false
	}
	t.leave(tc)
	tc.state, tc.active = stateAuthenticated, 1
	t.authenticated++
	t.addGroups(tc, 0, 1)
	return true
}

// authRoom reports whether each prefix of tc (not the address itself,
// bounded by MaxPerAddress) is below MaxAuthenticatedPerPrefix.
func (t *connTable) authRoom(tc *trackedConn) bool {
	for _, p := range tc.groups[1:] {
		if t.groups[p].auth >= t.cfg.MaxAuthenticatedPerPrefix {
			return false
		}
	}
	return true
}

// requestEnded records the end of a request that requestStarted counted;
// after the last one the connection is idle, no longer authenticated.
func (t *connTable) requestEnded(tc *trackedConn) bool {
	if _, ok := t.conns[tc]; !ok || tc.state != stateAuthenticated {
		return false
	}
	if tc.active--; tc.active > 0 {
		return false
	}
	t.leave(tc)
	tc.state = stateIdle
	tc.elem = t.idle.PushBack(tc)
	return true
}

// evictable reports whether tc has had its chance: a connection younger
// than EvictionGrace keeps its slot, so that a newcomer cannot push out
// one that is still in its handshake.
func (t *connTable) evictable(tc *trackedConn, now time.Time) bool {
	return now.Sub(tc.accepted) >= t.cfg.EvictionGrace
}

// capFull and unauthFull report whether a new connection needs a victim:
// for the global cap, or for the unauthenticated budget.
func (t *connTable) capFull() bool    { return len(t.conns) >= t.cfg.MaxConnections }
func (t *connTable) unauthFull() bool { return t.unauth.Len() >= t.cfg.MaxUnauthenticated }

// wait is how long the accept loop must leave new connections in the
// kernel's accept queue: 0 when one can be admitted now, the time until
// the oldest young connection becomes evictable, or -1 (until a
// connection closes) when every slot is authenticated.
func (t *connTable) wait(now time.Time) time.Duration {
	switch {
	case !t.capFull() && !t.unauthFull():
		return 0
	case t.unauth.Len() == 0:
		return -1 // until a request ends or an idle connection times out
	}
	front := t.unauth.Front().Value.(*trackedConn)
	return max(t.cfg.EvictionGrace-now.Sub(front.accepted), 0)
}

// victim picks the connection to close so that a connection from addr
// can be admitted, or reports refuse when none may be closed for it; nil
// and false when there is room. Served (idle) connections are never
// evicted: their answer may still be on its way; they end within
// RequestIdleTimeout. Among evictable unauthenticated connections: those of addresses not known as workers before known
// ones within their reserve; then silent before those that sent data;
// then the busiest address and prefixes; then the oldest. A newcomer
// from an unknown address takes the known workers' reserve only while
// every unknown connection is younger than EvictionGrace (a legitimate
// storm of new nodes is not cut); otherwise an unknown connection goes.
func (t *connTable) victim(addr netip.Addr, now time.Time) (victim *trackedConn, refuse bool) {
	room := !t.capFull() && !t.unauthFull()
	known := t.known.has(addr, now)
	if !known && t.unknownUnauth >= t.cfg.MaxUnauthenticated-t.cfg.KnownWorkerReserve {
		if v := t.pickUnauth(now, true); v != nil || room {
			// Every unknown connection is still young: the newcomer borrows
			// from the reserve, and the next unknown newcomer repays it.
			return v, false
		}
	}
	if room {
		return nil, false
	}
	v := t.pickUnauth(now, false)
	if v != nil && !known && t.protected(v) {
		// Protected connections rank last: every evictable one is a known
		// worker's within the reserve, which no unknown newcomer takes.
		return nil, true
	}
	return v, v == nil
}

// protected reports whether tc is a known worker's connection within
// the reserve.
func (t *connTable) protected(tc *trackedConn) bool {
	return tc.known && t.unauth.Len()-t.unknownUnauth <= t.cfg.KnownWorkerReserve
}

// pickUnauth returns the unauthenticated connection that ranks lowest
// (see victim), or nil; onlyUnknown restricts it to unknown addresses.
func (t *connTable) pickUnauth(now time.Time, onlyUnknown bool) *trackedConn {
	var best *trackedConn
	var bestKey evictionKey
	for e := t.unauth.Front(); e != nil; e = e.Next() {
		tc := e.Value.(*trackedConn)
		if !t.evictable(tc, now) {
			break // oldest first: the rest are younger
		}
		if onlyUnknown && tc.known {
			continue
		}
		k := evictionKey{protected: t.protected(tc), sentData: tc.sentData, busy: t.busyness(tc)}
		if best == nil || k.before(bestKey) {
			best, bestKey = tc, k
		}
	}
	return best
}

// evictionKey orders eviction candidates (oldest first within equal keys).
type evictionKey struct {
	protected bool // a known worker within the reserve
	sentData  bool // sent a ClientHello (or anything) before it was accepted
	busy      int  // unauthenticated connections of its address and prefixes
}

func (k evictionKey) before(o evictionKey) bool {
	switch {
	case k.protected != o.protected:
		return !k.protected
	case k.sentData != o.sentData:
		return !k.sentData
	default:
		return k.busy > o.busy
	}
}

// busyness sums the unauthenticated connections of tc's address and of
// each of its prefixes: a flood from many addresses of one /24 counts
// against all of them, and one address holding many counts once more.
func (t *connTable) busyness(tc *trackedConn) int {
	n := 0
	for _, p := range tc.groups {
		n += t.groups[p].unauth
	}
	return n
}

// counts are the connections by state, for checks and tests.
func (t *connTable) counts() (unauth, auth, idle int) {
	return t.unauth.Len(), t.authenticated, t.idle.Len()
}
