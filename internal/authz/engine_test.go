package authz

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

func testSnapshot(t *testing.T, created time.Time) *Snapshot {
	t.Helper()
	s, err := NewSnapshot([]Machine{
		{Name: "w1", Addresses: addrs("10.0.0.1", "fd00::1"), Hostnames: []string{"w1.lan"}, CertSANs: []string{"api.w1.example", "192.0.2.10"}, Created: created},
		{Name: "w2", Addresses: addrs("10.0.0.2"), Created: created},
		{Name: "twin-a", Addresses: addrs("10.0.0.9"), Created: created},
		{Name: "twin-b", Addresses: addrs("10.0.0.9"), Created: created},
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func req(peer string, names []string, ips ...string) *Request {
	return &Request{APIVersion: APIVersion, Peer: peer, DNSNames: names, IPAddresses: ips}
}

func TestDecide(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	rules := Rules{ExtraPrefixes: []netip.Prefix{netip.MustParsePrefix("fdcc::/16")}, DNSPatterns: []string{"{name}.cluster.example", "*.any.example"}}
	cases := []struct {
		name    string
		req     *Request
		outcome string
		reason  string
	}{
		{"own address and name", req("10.0.0.1", []string{"w1"}, "10.0.0.1", "127.0.0.1", "::1"), OutcomeAllowed, ""},
		{"mapped peer", req("::ffff:10.0.0.1", []string{"W1."}, "fd00::1"), OutcomeAllowed, ""},
		{"hostname certSANs pattern extra", req("10.0.0.1", []string{"w1.lan", "api.w1.example", "w1.cluster.example", "x.any.example"}, "192.0.2.10", "fdcc::5"), OutcomeAllowed, ""},
		{"unknown peer", req("10.0.0.7", []string{"w1"}, "10.0.0.7"), OutcomeUnknownMachine, "belongs to no machine"},
		{"shared address", req("10.0.0.9", []string{"twin-a"}, "10.0.0.9"), OutcomeUnknownMachine, "belongs to 2 machines"},
		{"other machine's address", req("10.0.0.1", []string{"w1"}, "10.0.0.2"), OutcomeAddressNotOwned, "belongs to machine w2"},
		{"address outside extras", req("10.0.0.1", []string{"w1"}, "192.0.2.99"), OutcomeAddressNotOwned, "not one of its addresses"},
		{"other machine's name", req("10.0.0.1", []string{"w2"}, "10.0.0.1"), OutcomeNameNotOwned, "belongs to machine w2"},
		{"other machine's pattern name", req("10.0.0.1", []string{"w2.cluster.example"}), OutcomeNameNotOwned, "not its name"},
		{"wildcard is one label", req("10.0.0.1", []string{"a.b.any.example"}), OutcomeNameNotOwned, "not its name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, _ := OpenState("")
			e := NewEngine(rules, st, func() time.Time { return t0 })
			if err := e.SetSnapshot(testSnapshot(t, t0)); err != nil {
				t.Fatal(err)
			}
			got, err := e.Decide(c.req)
			if err != nil {
				t.Fatal(err)
			}
			if got.Outcome != c.outcome || got.Allow != (c.outcome == OutcomeAllowed) || !strings.Contains(got.Reason, c.reason) {
				t.Fatalf("got %+v, want outcome %s with reason containing %q", got, c.outcome, c.reason)
			}
		})
	}
}

func TestPinsSurviveRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	open := func(machines []Machine) *Engine {
		st, err := OpenState(path)
		if err != nil {
			t.Fatal(err)
		}
		e := NewEngine(Rules{}, st, func() time.Time { return now })
		s, err := NewSnapshot(machines)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.SetSnapshot(s); err != nil {
			t.Fatal(err)
		}
		return e
	}
	e := open([]Machine{{Name: "w1", Addresses: addrs("10.0.0.1")}, {Name: "w2", Addresses: addrs("10.0.0.2")}})
	mustOutcome(t, e, req("10.0.0.1", []string{"w1"}, "10.0.0.1"), OutcomeAllowed)
	// Restart; the inventory now (wrongly or by attack) gives w1's address to w2.
	e = open([]Machine{{Name: "w1", Addresses: addrs("10.0.0.5")}, {Name: "w2", Addresses: addrs("10.0.0.1", "10.0.0.2")}})
	mustOutcome(t, e, req("10.0.0.1", []string{"w2"}, "10.0.0.1"), OutcomePinned)
	// An address pinned to w1 that asks for w2's name while w1 still owns it.
	e = open([]Machine{{Name: "w1", Addresses: addrs("10.0.0.1")}, {Name: "w2", Addresses: addrs("10.0.0.2")}})
	mustOutcome(t, e, req("10.0.0.1", []string{"w2"}, "10.0.0.1"), OutcomePinned)
	mustOutcome(t, e, req("10.0.0.1", []string{"w1"}, "10.0.0.1"), OutcomeAllowed)
	if ok, err := e.state.Unpin(netip.MustParseAddr("10.0.0.1")); !ok || err != nil {
		t.Fatalf("unpin: %t %v", ok, err)
	}
	e = open([]Machine{{Name: "w1", Addresses: addrs("10.0.0.5")}, {Name: "w2", Addresses: addrs("10.0.0.1", "10.0.0.2")}})
	mustOutcome(t, e, req("10.0.0.1", []string{"w2"}, "10.0.0.1"), OutcomeAllowed)
}

func TestJoinWindow(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name    string
		created time.Time // zero: first seen at t0
		at      time.Duration
		joined  bool
		outcome string
	}{
		{"inside, created", t0, 9 * time.Minute, false, OutcomeAllowed},
		{"outside, created", t0, 11 * time.Minute, false, OutcomeOutsideWindow},
		{"inside, first seen", time.Time{}, 9 * time.Minute, false, OutcomeAllowed},
		{"outside, first seen", time.Time{}, 11 * time.Minute, false, OutcomeOutsideWindow},
		{"renewal after the window", t0, time.Hour, true, OutcomeAllowed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			now := t0
			st, _ := OpenState("")
			e := NewEngine(Rules{JoinWindow: 10 * time.Minute}, st, func() time.Time { return now })
			s, _ := NewSnapshot([]Machine{{Name: "w1", Addresses: addrs("10.0.0.1"), Created: c.created}})
			if err := e.SetSnapshot(s); err != nil {
				t.Fatal(err)
			}
			r := req("10.0.0.1", []string{"w1"}, "10.0.0.1")
			if c.joined {
				mustOutcome(t, e, r, OutcomeAllowed)
			}
			now = t0.Add(c.at)
			mustOutcome(t, e, r, c.outcome)
		})
	}
}

func TestDecideErrors(t *testing.T) {
	st, _ := OpenState("")
	e := NewEngine(Rules{}, st, nil)
	if _, err := e.Decide(req("10.0.0.1", nil, "10.0.0.1")); !ErrNoInventory(err) {
		t.Fatalf("no inventory: %v", err)
	}
	s, _ := NewSnapshot(nil)
	if err := e.SetSnapshot(s); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Request{req("nonsense", nil), req("10.0.0.1", nil, "10.0.0.300")} {
		if got, err := e.Decide(r); err == nil {
			t.Errorf("%+v: got %+v, want an error", r, got)
		}
	}
	if _, err := NewSnapshot([]Machine{{Name: "a"}, {Name: "a"}}); err == nil {
		t.Error("duplicate names accepted")
	}
}

func TestStateWriteFailureDenies(t *testing.T) {
	dir := t.TempDir()
	st, err := OpenState(filepath.Join(dir, "missing-dir", "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(Rules{}, st, nil)
	s, _ := NewSnapshot([]Machine{{Name: "w1", Addresses: addrs("10.0.0.1"), Created: time.Now()}})
	e.snap.Store(s)
	if got, err := e.Decide(req("10.0.0.1", []string{"w1"}, "10.0.0.1")); err == nil {
		t.Fatalf("state not writable: got %+v, want an error (a pin that is not stored must not be acted on)", got)
	}
	if _, ok := st.Pin(netip.MustParseAddr("10.0.0.1")); ok {
		t.Fatal("pin kept in memory though not written")
	}
}

func mustOutcome(t *testing.T, e *Engine, r *Request, want string) {
	t.Helper()
	got, err := e.Decide(r)
	if err != nil {
		t.Fatal(err)
	}
	if got.Outcome != want {
		t.Fatalf("%v %v from %s: got %s (%s), want %s", r.DNSNames, r.IPAddresses, r.Peer, got.Outcome, got.Reason, want)
	}
}
