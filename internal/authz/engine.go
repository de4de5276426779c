package authz

import (
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"
)

// errNoInventory is returned while no inventory has been loaded yet: the
// decision cannot be made, which is not a denial (the caller retries).
var errNoInventory = errors.New("no inventory loaded yet")

// ErrNoInventory reports whether err means the inventory is not loaded.
func ErrNoInventory(err error) bool { return errors.Is(err, errNoInventory) }

// Engine decides requests against the current inventory snapshot, the
// rules and the durable state.
type Engine struct {
	rules atomic.Pointer[Rules]
	state *State
	now   func() time.Time
	snap  atomic.Pointer[Snapshot]
}

// NewEngine builds an engine; now nil means time.Now.
func NewEngine(rules Rules, state *State, now func() time.Time) *Engine {
	if now == nil {
		now = time.Now
	}
	e := &Engine{state: state, now: now}
	e.rules.Store(&rules)
	return e
}

// SetRules replaces the rules (a reloaded inventory file's).
func (e *Engine) SetRules(r Rules) { e.rules.Store(&r) }

// State returns the engine's durable state.
func (e *Engine) State() *State { return e.state }

// SetSnapshot installs a new inventory view and records first-seen times.
func (e *Engine) SetSnapshot(s *Snapshot) error {
	if err := e.state.observe(s, e.now()); err != nil {
		return err
	}
	e.snap.Store(s)
	return nil
}

// Snapshot returns the current inventory view, nil before the first.
func (e *Engine) Snapshot() *Snapshot { return e.snap.Load() }

// Decide answers one request. An error means no decision could be made
// (no inventory yet, the state could not be written): never an allow.
func (e *Engine) Decide(req *Request) (*Response, error) {
	s := e.snap.Load()
	if s == nil {
		return nil, errNoInventory
	}
	peer, ips, err := parseAddrs(req)
	if err != nil {
		return nil, err
	}
	v := e.rules.Load().Match(s, peer, req.DNSNames, ips)
	if pinned, ok := e.pinConflict(s, peer, v, req.DNSNames); ok {
		v = pinned
	}
	if v.Outcome == OutcomeAllowed {
		v, err = e.admit(peer, v)
		if err != nil {
			return nil, err
		}
	}
	return respond(v), nil
}

func respond(v Verdict) *Response {
	r := &Response{APIVersion: APIVersion, Allow: v.Outcome == OutcomeAllowed, Outcome: v.Outcome, Reason: v.Reason}
	if v.Machine != nil {
		r.Machine = v.Machine.Name
	}
	return r
}

func parseAddrs(req *Request) (netip.Addr, []netip.Addr, error) {
	peer, err := netip.ParseAddr(req.Peer)
	if err != nil {
		return netip.Addr{}, nil, fmt.Errorf("peer address: %w", err)
	}
	ips := make([]netip.Addr, 0, len(req.IPAddresses))
	for _, s := range req.IPAddresses {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Addr{}, nil, fmt.Errorf("IP SAN: %w", err)
		}
		ips = append(ips, a.Unmap())
	}
	return peer.Unmap(), ips, nil
}

// pinConflict turns a verdict into denied_pinned when the peer address
// is pinned to machine X and the request is for another machine: the
// address now belongs to another machine, or the request asks for a DNS
// name another machine owns (its identity).
func (e *Engine) pinConflict(s *Snapshot, peer netip.Addr, v Verdict, names []string) (Verdict, bool) {
	pin, ok := e.state.Pin(peer)
	if !ok {
		return v, false
	}
	other := v.Machine
	if other == nil || other.Name == pin.Machine {
		other = foreignNameOwner(s, pin.Machine, names)
	}
	if other == nil {
		return v, false
	}
	return deny(OutcomePinned, "peer address %s is pinned to machine %s since %s but asks for machine %s: possible takeover; if the address was given to %s on purpose, remove the pin (steward-trustd-authorizer unpin %s)",
		peer, pin.Machine, pin.Since.Format(time.RFC3339), other.Name, other.Name, peer), true
}

// foreignNameOwner returns a machine other than pinned that owns one of
// the requested DNS names.
func foreignNameOwner(s *Snapshot, pinned string, names []string) *Machine {
	for _, d := range names {
		if m := s.nameOwner(d, pinned); m != nil {
			return m
		}
	}
	return nil
}

// admit applies the join window and records the pin of an allowed
// verdict.
func (e *Engine) admit(peer netip.Addr, v Verdict) (Verdict, error) {
	now := e.now()
	if w := e.windowVerdict(v.Machine, now); w.Outcome != OutcomeAllowed {
		return w, nil
	}
	pin, ok, err := e.state.recordIssue(peer, v.Machine.Name, now)
	if err != nil {
		return Verdict{}, err
	}
	if !ok {
		return deny(OutcomePinned, "peer address %s is pinned to machine %s since %s; possible takeover (steward-trustd-authorizer unpin %s if intended)", peer, pin.Machine, pin.Since.Format(time.RFC3339), peer), nil
	}
	return v, nil
}

func (e *Engine) windowVerdict(m *Machine, now time.Time) Verdict {
	window := e.rules.Load().JoinWindow
	if window <= 0 {
		return Verdict{Outcome: OutcomeAllowed}
	}
	if _, joined := e.state.joined(m.Name); joined {
		return Verdict{Outcome: OutcomeAllowed}
	}
	since := m.Created
	if since.IsZero() {
		t, ok := e.state.firstSeen(m.Name)
		if !ok {
			return deny(OutcomeOutsideWindow, "machine %s: no record of when it appeared; its join window cannot be checked", m.Name)
		}
		since = t
	}
	if end := since.Add(window); now.After(end) {
		return deny(OutcomeOutsideWindow, "machine %s appeared at %s; its join window of %s closed at %s: recreate it in the inventory (or, in a file, update its \"created\" time) to open a new one", m.Name, since.UTC().Format(time.RFC3339), window, end.UTC().Format(time.RFC3339))
	}
	return Verdict{Outcome: OutcomeAllowed}
}
