package server

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/devtest"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeConn is a connection from a given address; it records Close.
type fakeConn struct {
	net.Conn
	from   *net.TCPAddr
	closed bool
}

func (c *fakeConn) RemoteAddr() net.Addr { return c.from }
func (c *fakeConn) Close() error         { c.closed = true; return nil }

// tableAt returns a connection table and a tracked connection maker whose
// connections were accepted at the times given.
func tableAt(cfg ConnLimits) (*connTable, func(ip string, at time.Time, sentData bool) *trackedConn) {
	t := newConnTable(cfg.withDefaults())
	return t, func(ip string, at time.Time, sentData bool) *trackedConn {
		tc := &trackedConn{addr: netip.MustParseAddr(ip), accepted: at, sentData: sentData}
		t.add(tc, at)
		return tc
	}
}

func TestEvictionOrder(t *testing.T) {
	t0 := time.Unix(1000, 0)
	later := t0.Add(time.Minute)
	cases := []struct {
		name  string
		conns []struct {
			ip   string
			data bool
		}
		newcomer string
		want     int // index of the victim; -1: none may go
	}{
		{"silent before one that sent a ClientHello", conns("10.0.0.1+", "10.9.0.1-", "10.9.0.2+"), "10.5.0.1", 1},
		{"busiest address", conns("10.0.0.1+", "10.1.0.1+", "10.1.0.1+"), "10.5.0.1", 1},
		{"busiest /24 over many addresses, not the oldest", conns("10.0.0.1+", "10.1.0.1+", "10.1.0.2+"), "10.5.0.1", 1},
		{"busiest /16", conns("10.0.0.1+", "10.1.1.1+", "10.1.2.1+"), "10.5.0.1", 1},
		{"equal: the oldest", conns("10.0.0.1+", "10.1.0.1+", "10.2.0.1+"), "10.5.0.1", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			table, add := tableAt(ConnLimits{MaxConnections: 10, MaxUnauthenticated: 3, KnownWorkerReserve: 1})
			var tcs []*trackedConn
			for i, cn := range c.conns {
				tcs = append(tcs, add(cn.ip, t0.Add(time.Duration(i)*time.Millisecond), cn.data))
			}
			v, refuse := table.victim(netip.MustParseAddr(c.newcomer), later)
			if refuse || v != tcs[c.want] {
				t.Fatalf("victim %v (refuse %v), want connection %d", v, refuse, c.want)
			}
		})
	}
}

// conns parses "ip+" (sent data) and "ip-" (silent).
func conns(specs ...string) []struct {
	ip   string
	data bool
} {
	out := make([]struct {
		ip   string
		data bool
	}, len(specs))
	for i, s := range specs {
		out[i].ip, out[i].data = s[:len(s)-1], s[len(s)-1] == '+'
	}
	return out
}

// TestYoungConnectionsKeepTheirSlot: within EvictionGrace nothing is
// evicted and the accept loop waits; afterwards the oldest may go.
func TestYoungConnectionsKeepTheirSlot(t *testing.T) {
	t0 := time.Unix(1000, 0)
	table, add := tableAt(ConnLimits{MaxConnections: 4, MaxUnauthenticated: 2, EvictionGrace: 2 * time.Second})
	add("10.0.0.1", t0, true)
	add("10.0.0.2", t0.Add(time.Second), true)
	if d := table.wait(t0.Add(time.Second)); d != time.Second {
		t.Fatalf("wait %v, want 1s (until the first connection has had its grace)", d)
	}
	if v, refuse := table.victim(netip.MustParseAddr("10.0.0.3"), t0.Add(time.Second)); v != nil || !refuse {
		t.Fatalf("a young connection was evicted (%v)", v)
	}
	if d := table.wait(t0.Add(2 * time.Second)); d != 0 {
		t.Fatalf("wait %v after the grace, want 0", d)
	}
}

// TestKnownWorkersKeepAReserve: addresses that passed a request keep a
// share of the unauthenticated budget that unknown ones cannot take.
func TestKnownWorkersKeepAReserve(t *testing.T) {
	t0 := time.Unix(1000, 0)
	later := t0.Add(time.Minute)
	table, add := tableAt(ConnLimits{MaxConnections: 100, MaxUnauthenticated: 4, KnownWorkerReserve: 2})
	worker := add("10.0.0.1", t0, true)
	table.requestStarted(worker, t0)
	table.requestEnded(worker)
	table.remove(worker)
	known := add("10.0.0.1", t0, true) // the worker's next connection
	a1 := add("10.9.0.1", t0, true)
	add("10.9.0.2", t0, true)
	if v, refuse := table.victim(netip.MustParseAddr("10.9.0.3"), later); refuse || v != a1 {
		t.Fatalf("an unknown newcomer at the unknown share must evict an unknown connection, got %v", v)
	}
	add("10.0.0.2", t0, true)
	if v, _ := table.victim(netip.MustParseAddr("10.0.0.1"), later); v == known {
		t.Fatal("a known worker's connection within the reserve was evicted first")
	}
}

// TestUnknownNewcomerSparesTheReserve: when every unknown connection is
// still in its grace and the budget is full, a newcomer from an unknown
// address is refused rather than given a known worker's connection
// within the reserve (a fast flood of unknown addresses would otherwise
// cut every renewal that needs longer than the grace).
func TestUnknownNewcomerSparesTheReserve(t *testing.T) {
	t0 := time.Unix(1000, 0)
	later := t0.Add(time.Minute)
	table, add := tableAt(ConnLimits{MaxConnections: 100, MaxUnauthenticated: 4, KnownWorkerReserve: 2, EvictionGrace: 2 * time.Second})
	worker := add("10.0.0.1", t0, true)
	table.requestStarted(worker, t0)
	table.requestEnded(worker)
	table.remove(worker)
	known := add("10.0.0.1", t0, true)
	for i := range 3 {
		add(fmt.Sprintf("10.9.0.%d", i+1), later.Add(-time.Second), true)
	}
	if v, refuse := table.victim(netip.MustParseAddr("10.9.0.9"), later); v == known || !refuse {
		t.Fatalf("unknown newcomer: victim %v (refuse %v), want a refusal that spares the known worker's connection", v, refuse)
	}
	if v, refuse := table.victim(netip.MustParseAddr("10.0.0.1"), later); refuse || v != known {
		t.Fatalf("known newcomer: victim %v (refuse %v), want the known connection past its grace", v, refuse)
	}
}

// TestTokenIsNotALease: a connection is authenticated only while it
// carries a request; then it is idle, and at the cap it goes first.
func TestTokenIsNotALease(t *testing.T) {
	t0 := time.Unix(1000, 0)
	table, add := tableAt(ConnLimits{MaxConnections: 2, MaxUnauthenticated: 2, MaxAuthenticatedPerPrefix: 1})
	a := add("10.0.0.1", t0, true)
	b := add("10.0.0.2", t0, true)
	if !table.requestStarted(a, t0) {
		t.Fatal("request not counted")
	}
	if table.requestStarted(b, t0) {
		t.Fatal("a second authenticated connection in one /24 beyond MaxAuthenticatedPerPrefix")
	}
	if u, au, _ := table.counts(); u != 1 || au != 1 {
		t.Fatalf("unauth %d auth %d, want 1 and 1", u, au)
	}
	table.requestEnded(a)
	if _, au, idle := table.counts(); au != 0 || idle != 1 {
		t.Fatalf("after its request: auth %d idle %d, want 0 and 1", au, idle)
	}
	if d := table.wait(t0.Add(time.Minute)); d != 0 {
		t.Fatalf("wait %v with a slot taken by a served connection and b evictable", d)
	}
	if v, _ := table.victim(netip.MustParseAddr("10.5.0.1"), t0.Add(time.Minute)); v != b {
		t.Fatalf("at the cap the unauthenticated connection goes, never the served one whose answer may be in flight; got %v", v)
	}
}

// TestAccountingProperties drives random accept, request, close, reset
// (a close and an accept from the same address and port) and eviction
// sequences through the listener's accounting and checks after every
// step that the counts match the live connections, the budgets hold,
// and each connection is released exactly once.
func TestAccountingProperties(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { accountingRun(t, rand.New(rand.NewPCG(seed, 7))) })
	}
}

func accountingRun(t *testing.T, rng *rand.Rand) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	l := newConnListener(ln, ConnLimits{MaxConnections: 12, MaxUnauthenticated: 6, MaxPerAddress: 4, EvictionGrace: time.Millisecond,
		HandshakeTimeout: time.Hour, KnownWorkerReserve: 2, DeferAccept: -1}, NewMetrics(prometheus.NewRegistry(), "file", true), nil)
	clock := time.Unix(1000, 0)
	l.now = func() time.Time { return clock }
	var live, all []*trackedConn
	for step := range 400 {
		clock = clock.Add(time.Millisecond)
		live = accountingStep(t, l, rng, live, &all)
		checkAccounting(t, l, live, step)
	}
}

// accountingStep runs one random operation. all holds every connection
// ever admitted: the close and request paths are also driven on ones
// another path already closed (an evicted or expired connection that
// gRPC closes later), which must not release their slot again.
func accountingStep(t *testing.T, l *connListener, rng *rand.Rand, live []*trackedConn, all *[]*trackedConn) []*trackedConn {
	t.Helper()
	pick := func() *trackedConn {
		if rng.IntN(3) == 0 {
			return (*all)[rng.IntN(len(*all))]
		}
		return live[rng.IntN(len(live))]
	}
	switch op := rng.IntN(6); {
	case op <= 1 || len(live) == 0: // accept (ports repeat: a reset and reconnect)
		from := &net.TCPAddr{IP: net.IPv4(10, byte(rng.IntN(3)), 0, byte(1+rng.IntN(4))), Port: 1000 + rng.IntN(3)}
		if l.table.wait(l.now()) == 0 {
			if tc := l.admit(&fakeConn{from: from}); tc != nil {
				live = append(live, tc)
				*all = append(*all, tc)
			}
		}
	case op == 2:
		pick().Close()
		pick().Close() // a second close path for possibly the same connection
	case op == 3:
		tc := pick()
		if l.requestStarted(tc) && rng.IntN(2) == 0 {
			l.requestEnded(tc)
		}
	case op == 4:
		l.closeUnauthenticated(pick(), closedFirstMessage)
	default:
		l.requestEnded(pick())
	}
	return pruneClosed(live)
}

func pruneClosed(live []*trackedConn) []*trackedConn {
	out := live[:0]
	for _, tc := range live {
		if !tc.Conn.(*fakeConn).closed {
			out = append(out, tc)
		}
	}
	return out
}

func checkAccounting(t *testing.T, l *connListener, live []*trackedConn, step int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	tbl := l.table
	unauth, auth, idle := tbl.counts()
	switch {
	case len(tbl.conns) != len(live):
		t.Fatalf("step %d: table holds %d connections, %d are open", step, len(tbl.conns), len(live))
	case unauth+auth+idle != len(live):
		t.Fatalf("step %d: states %d+%d+%d ≠ %d open", step, unauth, auth, idle, len(live))
	case len(live) > l.cfg.MaxConnections || unauth > l.cfg.MaxUnauthenticated:
		t.Fatalf("step %d: %d open (cap %d), %d unauthenticated (budget %d)", step, len(live), l.cfg.MaxConnections, unauth, l.cfg.MaxUnauthenticated)
	}
	for _, tc := range live {
		if _, ok := tbl.conns[tc]; !ok {
			t.Fatalf("step %d: open connection %p not in the table", step, tc)
		}
	}
	for state, n := range map[string]int{stateUnauthenticated: unauth, stateAuthenticated: auth, stateIdle: idle} {
		if g := testutil.ToFloat64(l.metrics.connsOpen.WithLabelValues(state)); g != float64(n) {
			t.Fatalf("step %d: gauge %s = %v, %d such connections open", step, state, g, n)
		}
	}
	sum := 0
	for p, g := range tbl.groups {
		if p.Bits() == p.Addr().BitLen() {
			sum += g.total
		}
		if g.total <= 0 || g.unauth < 0 || g.auth < 0 {
			t.Fatalf("step %d: group %v counts %+v", step, p, *g)
		}
	}
	if sum != len(live) {
		t.Fatalf("step %d: per-address counts sum to %d, %d open", step, sum, len(live))
	}
}

// emfileListener fails its first Accepts with EMFILE, as a process out of
// file descriptors does.
type emfileListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *emfileListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		time.Sleep(5 * time.Millisecond)
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestOutOfFileDescriptorsIsAState: EMFILE on accept is counted, sets the
// accept_failing state (gauge at once, one log line once it has held),
// makes the listener not ready after the grace, and clears when
// accepting works again.
func TestOutOfFileDescriptorsIsAState(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	inner := &emfileListener{Listener: ln}
	inner.fails.Store(1 << 20)
	logs := &devtest.LockedBuffer{}
	m := NewMetrics(prometheus.NewRegistry(), "file", true)
	st := newStateLog(slog.New(slog.NewJSONHandler(logs, nil)), time.Minute, 100*time.Millisecond)
	st.onChange = m.frontState
	l := newConnListener(inner, ConnLimits{DeferAccept: -1}, m, st)
	l.stuckGrace = 300 * time.Millisecond
	go l.Run()
	defer l.Close()
	gauge := func() float64 { return testutil.ToFloat64(m.frontDoorState.WithLabelValues(frontAcceptFailing)) }
	eventually(t, "not ready", func() bool { st.Sweep(); return l.Check() != nil && gauge() == 1 })
	if got := testutil.ToFloat64(m.acceptErrors.WithLabelValues(acceptFDExhausted)); got < 2 {
		t.Fatalf("fd_exhausted accept errors %v", got)
	}
	if !strings.Contains(logs.String(), "out of file descriptors (raise LimitNOFILE") {
		t.Fatalf("no log line naming the cause and the fix:\n%s", logs.String())
	}
	inner.fails.Store(0)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	eventually(t, "recovered", func() bool { return l.Check() == nil && gauge() == 0 })
}
