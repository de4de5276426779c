package authz

import (
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Machine is one entry of an inventory.
type Machine struct {
	// Name is the machine's name (Node or Machine name, or the file's).
	Name string
	// Addresses are the IP addresses the machine owns.
	Addresses []netip.Addr
	// Hostnames are further DNS names the machine owns.
	Hostnames []string
	// CertSANs are extra names or addresses the machine's configuration
	// adds to its certificates (Talos's machine.certSANs).
	CertSANs []string
	// UUID is the machine's identifier, when known.
	UUID string
	// Created is when the machine appeared in the inventory (zero when
	// the source does not know; the state then records when it was
	// first seen).
	Created time.Time
}

// Snapshot is one consistent view of an inventory: no machine is half
// updated while a decision reads it.
type Snapshot struct {
	machines []Machine
	byAddr   map[netip.Addr][]int
	byName   map[string]int
	byDNS    map[string][]int // lower-cased name, hostname or certSAN -> machines
}

// NewSnapshot indexes machines. Names must be unique: the source is
// wrong otherwise and its update must be refused.
func NewSnapshot(machines []Machine) (*Snapshot, error) {
	s := &Snapshot{machines: machines, byAddr: map[netip.Addr][]int{}, byName: map[string]int{}, byDNS: map[string][]int{}}
	for i, m := range machines {
		if m.Name == "" {
			return nil, fmt.Errorf("machine %d has no name", i)
		}
		if _, dup := s.byName[m.Name]; dup {
			return nil, fmt.Errorf("machine name %q appears twice", m.Name)
		}
		s.byName[m.Name] = i
		s.indexNames(i, m)
		for _, a := range m.Addresses {
			s.byAddr[a.Unmap()] = append(s.byAddr[a.Unmap()], i)
		}
	}
	return s, nil
}

// indexNames files machine i under each DNS name it owns (once each).
func (s *Snapshot) indexNames(i int, m Machine) {
	for _, n := range append(append([]string{m.Name}, m.Hostnames...), m.CertSANs...) {
		n = normalName(n)
		if idx := s.byDNS[n]; len(idx) == 0 || idx[len(idx)-1] != i {
			s.byDNS[n] = append(idx, i)
		}
	}
}

// nameOwner returns a machine other than except that owns name.
func (s *Snapshot) nameOwner(name, except string) *Machine {
	for _, i := range s.byDNS[normalName(name)] {
		if m := &s.machines[i]; m.Name != except {
			return m
		}
	}
	return nil
}

func normalName(n string) string { return strings.ToLower(strings.TrimSuffix(n, ".")) }

// Len is the number of machines.
func (s *Snapshot) Len() int { return len(s.machines) }

// Machines returns the machines (not to be modified).
func (s *Snapshot) Machines() []Machine { return s.machines }

// owner returns the one machine owning a, how many own it.
func (s *Snapshot) owner(a netip.Addr) (*Machine, int) {
	idx := s.byAddr[a.Unmap()]
	if len(idx) != 1 {
		return nil, len(idx)
	}
	return &s.machines[idx[0]], 1
}

// Lookup returns the machine named name.
func (s *Snapshot) Lookup(name string) (*Machine, bool) {
	i, ok := s.byName[name]
	if !ok {
		return nil, false
	}
	return &s.machines[i], true
}

// Rules are the configurable parts of a decision.
type Rules struct {
	// ExtraPrefixes are IP SANs any machine may ask for besides its own
	// addresses (loopback is always allowed), e.g. KubeSpan's ULA range.
	// An address another machine owns is never an extra.
	ExtraPrefixes []netip.Prefix
	// DNSPatterns are further DNS SANs a machine may ask for: "{name}"
	// stands for the machine's name, a leading "*." for one label.
	DNSPatterns []string
	// JoinWindow, when positive, is how long after a machine appeared
	// it may take its first certificate.
	JoinWindow time.Duration
}

// loopback is always an allowed extra: Talos puts 127.0.0.1 and ::1 in
// apid's certificate.
func loopback() []netip.Prefix {
	return []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
}

// Verdict is a decision before pinning: the outcome, why, and the
// machine the request was matched to.
type Verdict struct {
	Outcome string
	Reason  string
	Machine *Machine
}

func deny(outcome, format string, args ...any) Verdict {
	return Verdict{Outcome: outcome, Reason: fmt.Sprintf(format, args...)}
}

// denyFor is a refusal of a request matched to machine m.
func denyFor(m *Machine, outcome, why string) Verdict {
	return Verdict{Outcome: outcome, Reason: "machine " + m.Name + ": " + why, Machine: m}
}

// Match applies the address and name rules (not pins or the window,
// which need state): the peer must belong to exactly one machine, and
// every SAN must be that machine's or an allowed extra.
func (r Rules) Match(s *Snapshot, peer netip.Addr, dnsNames []string, ips []netip.Addr) Verdict {
	m, n := s.owner(peer)
	switch {
	case n == 0:
		return deny(OutcomeUnknownMachine, "peer address %s belongs to no machine in the inventory", peer.Unmap())
	case n > 1:
		return deny(OutcomeUnknownMachine, "peer address %s belongs to %d machines in the inventory; fix the inventory so one machine owns it", peer.Unmap(), n)
	}
	for _, ip := range ips {
		if err := r.checkIP(s, m, ip.Unmap()); err != "" {
			return denyFor(m, OutcomeAddressNotOwned, err)
		}
	}
	for _, d := range dnsNames {
		if err := r.checkName(s, m, d); err != "" {
			return denyFor(m, OutcomeNameNotOwned, err)
		}
	}
	return Verdict{Outcome: OutcomeAllowed, Reason: "machine " + m.Name + " owns the peer address and every SAN", Machine: m}
}

func (r Rules) checkIP(s *Snapshot, m *Machine, ip netip.Addr) string {
	if ownsAddr(m, ip) || containsString(m.CertSANs, ip.String()) {
		return ""
	}
	if other, n := s.owner(ip); n > 0 {
		if other == nil {
			return fmt.Sprintf("IP SAN %s belongs to other machines", ip)
		}
		return fmt.Sprintf("IP SAN %s belongs to machine %s", ip, other.Name)
	}
	for _, p := range append(loopback(), r.ExtraPrefixes...) {
		if p.Contains(ip) {
			return ""
		}
	}
	return fmt.Sprintf("IP SAN %s is not one of its addresses nor an allowed extra range", ip)
}

func (r Rules) checkName(s *Snapshot, m *Machine, name string) string {
	name = normalName(name)
	if ownsName(m, name) {
		return ""
	}
	if other := s.nameOwner(name, m.Name); other != nil {
		return fmt.Sprintf("DNS SAN %s belongs to machine %s", name, other.Name)
	}
	for _, p := range r.DNSPatterns {
		if patternMatches(p, m.Name, name) {
			return ""
		}
	}
	return fmt.Sprintf("DNS SAN %s is not its name nor allowed by a pattern", name)
}

func ownsAddr(m *Machine, ip netip.Addr) bool {
	for _, a := range m.Addresses {
		if a.Unmap() == ip {
			return true
		}
	}
	return false
}

func ownsName(m *Machine, name string) bool {
	return strings.EqualFold(m.Name, name) || containsFold(m.Hostnames, name) || containsFold(m.CertSANs, name)
}

// patternMatches matches name against p with "{name}" replaced by the
// machine's name; a leading "*." matches exactly one label.
func patternMatches(p, machine, name string) bool {
	p = strings.ToLower(strings.ReplaceAll(p, "{name}", machine))
	if rest, ok := strings.CutPrefix(p, "*."); ok {
		label, tail, found := strings.Cut(name, ".")
		return found && label != "" && tail == rest
	}
	return p == name
}

func containsFold(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(strings.TrimSuffix(v, "."), s) {
			return true
		}
	}
	return false
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
