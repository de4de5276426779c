package inventory

import (
	"net/netip"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/authz"
)

func TestCombined(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	st, _ := authz.OpenState("")
	e := authz.NewEngine(authz.Rules{}, st, nil)
	c := NewCombined(e, authz.Rules{}, "nodes", "machines")
	node := Entry{Key: "w1", Machine: authz.Machine{Name: "w1", Addresses: addrsOf("10.0.0.1"), Created: t0.Add(time.Hour)}}
	if err := c.Update("nodes", []Entry{node}); err != nil {
		t.Fatal(err)
	}
	if e.Snapshot() != nil {
		t.Fatal("installed before every source reported")
	}
	machine := Entry{Key: "w1", Machine: authz.Machine{Name: "md-0-abc", Addresses: addrsOf("10.0.0.1", "10.0.1.1"), UUID: "aws:///i-1", Created: t0}}
	other := Entry{Key: "md-0-def", Machine: authz.Machine{Name: "md-0-def", Addresses: addrsOf("10.0.0.2")}}
	if err := c.Update("machines", []Entry{machine, other}); err != nil {
		t.Fatal(err)
	}
	s := e.Snapshot()
	if s == nil || s.Len() != 2 {
		t.Fatalf("snapshot: %+v", s)
	}
	m, ok := s.Lookup("w1")
	if !ok || len(m.Addresses) != 2 || m.Hostnames[0] != "md-0-abc" || m.UUID != "aws:///i-1" || !m.Created.Equal(t0) {
		t.Fatalf("merged machine: %+v", m)
	}
	r, err := e.Decide(&authz.Request{APIVersion: authz.APIVersion, Peer: "10.0.0.1", DNSNames: []string{"w1", "md-0-abc"}, IPAddresses: []string{"10.0.1.1"}})
	if err != nil || !r.Allow {
		t.Fatalf("merged machine refused: %+v %v", r, err)
	}
	if err := c.Update("machines", nil); err != nil { // the Machine deleted
		t.Fatal(err)
	}
	if m, _ := e.Snapshot().Lookup("w1"); len(m.Addresses) != 1 {
		t.Fatalf("deleted Machine's address kept: %+v", m)
	}
}

func addrsOf(ss ...string) []netip.Addr {
	out := make([]netip.Addr, 0, len(ss))
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}
