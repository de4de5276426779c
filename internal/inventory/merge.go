package inventory

import (
	"fmt"
	"slices"
	"sync"

	"github.com/steward-trustd/steward-trustd/internal/authz"
)

// Entry is one source's view of a machine, with the name it is merged
// under: a Cluster API Machine merges into its Node (status.nodeRef).
type Entry struct {
	Key     string
	Machine authz.Machine
}

// Merge combines entries with the same key into one machine: the union
// of addresses and names, the earliest creation time. A machine seen as
// both a Node and a Machine is then one machine, not two owners of one
// address.
func Merge(entries []Entry) []authz.Machine {
	byKey := map[string]int{}
	out := make([]authz.Machine, 0, len(entries))
	for _, e := range entries {
		i, ok := byKey[e.Key]
		if !ok {
			byKey[e.Key] = len(out)
			out = append(out, authz.Machine{Name: e.Key})
			i = len(out) - 1
		}
		mergeInto(&out[i], e.Machine)
	}
	return out
}

func mergeInto(dst *authz.Machine, m authz.Machine) {
	for _, a := range m.Addresses {
		if !slices.Contains(dst.Addresses, a) {
			dst.Addresses = append(dst.Addresses, a)
		}
	}
	names := m.Hostnames
	if m.Name != dst.Name {
		names = append([]string{m.Name}, names...)
	}
	dst.Hostnames = appendNew(dst.Hostnames, names...)
	dst.CertSANs = appendNew(dst.CertSANs, m.CertSANs...)
	if dst.UUID == "" {
		dst.UUID = m.UUID
	}
	if !m.Created.IsZero() && (dst.Created.IsZero() || m.Created.Before(dst.Created)) {
		dst.Created = m.Created
	}
}

func appendNew(list []string, add ...string) []string {
	for _, s := range add {
		if !slices.Contains(list, s) {
			list = append(list, s)
		}
	}
	return list
}

// Combined installs the merge of several sources into an engine, once
// every source has delivered its first complete view: a half-synced
// inventory would refuse machines it simply has not listed yet.
type Combined struct {
	engine *authz.Engine
	rules  authz.Rules

	mu        sync.Mutex
	parts     map[string][]Entry
	fileRules authz.Rules
	pending   map[string]bool
}

// NewCombined waits for the named sources; rules are the command's.
func NewCombined(e *authz.Engine, rules authz.Rules, sources ...string) *Combined {
	c := &Combined{engine: e, rules: rules, parts: map[string][]Entry{}, pending: map[string]bool{}}
	for _, s := range sources {
		c.pending[s] = true
	}
	return c
}

// Update replaces source's entries and installs the merge when every
// source has reported.
func (c *Combined) Update(source string, entries []Entry) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.parts[source] = entries
	delete(c.pending, source)
	return c.installLocked()
}

// UpdateFile is Update for a parsed inventory file, whose rules join
// the command's.
func (c *Combined) UpdateFile(source string) func(*Parsed) error {
	return func(p *Parsed) error {
		entries := make([]Entry, 0, p.Snapshot.Len())
		for _, m := range p.Snapshot.Machines() {
			entries = append(entries, Entry{Key: m.Name, Machine: m})
		}
		c.mu.Lock()
		c.fileRules = p.Rules
		c.mu.Unlock()
		return c.Update(source, entries)
	}
}

func (c *Combined) installLocked() error {
	if len(c.pending) > 0 {
		return nil
	}
	var all []Entry
	for _, part := range c.parts {
		all = append(all, part...)
	}
	if len(all) > MaxMachines {
		return fmt.Errorf("inventory sources list %d machines, limit %d", len(all), MaxMachines)
	}
	snap, err := authz.NewSnapshot(Merge(all))
	if err != nil {
		return err
	}
	if err := c.engine.SetSnapshot(snap); err != nil {
		return err
	}
	c.engine.SetRules(MergeRules(c.fileRules, c.rules))
	return nil
}
