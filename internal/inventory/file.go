// Package inventory reads the machines an authorizer decides against:
// a static JSON file (hot-reloaded) here; the Kubernetes sources live
// with the authorizer command, so that the daemon links no client-go.
package inventory

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/authz"
)

// FileVersion names the inventory file format.
const FileVersion = "inventory.steward-trustd.dev/v1"

// MaxFileBytes bounds the inventory file.
const MaxFileBytes = 16 << 20

// MaxMachines bounds the machines of one inventory.
const MaxMachines = 100_000

// File is the inventory file's form.
type File struct {
	APIVersion string        `json:"apiVersion"`
	Rules      *FileRules    `json:"rules,omitempty"`
	Machines   []FileMachine `json:"machines"`
}

// FileRules are the optional rules of an inventory file.
type FileRules struct {
	// ExtraCIDRs are ranges any machine may have IP SANs in.
	ExtraCIDRs []string `json:"extraCIDRs,omitempty"`
	// DNSPatterns are extra DNS SANs ("{name}.example.com", "*.x").
	DNSPatterns []string `json:"dnsPatterns,omitempty"`
	// JoinWindow is a Go duration ("30m"); "" or "0" means no window.
	JoinWindow string `json:"joinWindow,omitempty"`
}

// FileMachine is one machine of the file.
type FileMachine struct {
	Name      string   `json:"name"`
	Addresses []string `json:"addresses"`
	Hostnames []string `json:"hostnames,omitempty"`
	CertSANs  []string `json:"certSANs,omitempty"`
	UUID      string   `json:"uuid,omitempty"`
	// Created is when the machine was added (RFC 3339); the join window
	// counts from it, else from when the authorizer first saw it.
	Created string `json:"created,omitempty"`
}

// Parsed is a checked inventory: its snapshot and rules.
type Parsed struct {
	Snapshot *authz.Snapshot
	Rules    authz.Rules
}

// ParseFile decodes an inventory strictly (unknown fields, trailing data,
// bad addresses, duplicate names are errors, each saying where).
func ParseFile(data []byte) (*Parsed, error) {
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("inventory is %d bytes, limit %d", len(data), MaxFileBytes)
	}
	var f File
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("malformed inventory JSON: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("trailing data after the inventory object")
	}
	if f.APIVersion != FileVersion {
		return nil, fmt.Errorf("inventory apiVersion %q, want %q", f.APIVersion, FileVersion)
	}
	if len(f.Machines) > MaxMachines {
		return nil, fmt.Errorf("inventory lists %d machines, limit %d", len(f.Machines), MaxMachines)
	}
	return f.parse()
}

func (f *File) parse() (*Parsed, error) {
	rules, err := f.Rules.parse()
	if err != nil {
		return nil, err
	}
	machines := make([]authz.Machine, 0, len(f.Machines))
	for i, fm := range f.Machines {
		m, err := fm.parse()
		if err != nil {
			return nil, fmt.Errorf("machines[%d] (%q): %w", i, fm.Name, err)
		}
		machines = append(machines, m)
	}
	snap, err := authz.NewSnapshot(machines)
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	return &Parsed{Snapshot: snap, Rules: rules}, nil
}

func (r *FileRules) parse() (authz.Rules, error) {
	var out authz.Rules
	if r == nil {
		return out, nil
	}
	prefixes, err := ParsePrefixes(r.ExtraCIDRs)
	if err != nil {
		return out, fmt.Errorf("rules.extraCIDRs: %w", err)
	}
	out.ExtraPrefixes = prefixes
	if err := CheckPatterns(r.DNSPatterns); err != nil {
		return out, fmt.Errorf("rules.dnsPatterns: %w", err)
	}
	out.DNSPatterns = r.DNSPatterns
	if r.JoinWindow != "" {
		d, err := time.ParseDuration(r.JoinWindow)
		if err != nil || d < 0 {
			return out, fmt.Errorf("rules.joinWindow %q: want a duration such as 30m", r.JoinWindow)
		}
		out.JoinWindow = d
	}
	return out, nil
}

func (fm FileMachine) parse() (authz.Machine, error) {
	m := authz.Machine{Name: fm.Name, Hostnames: fm.Hostnames, CertSANs: fm.CertSANs, UUID: fm.UUID}
	if fm.Name == "" {
		return m, fmt.Errorf("no name")
	}
	for _, s := range fm.Addresses {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return m, fmt.Errorf("address %q is not an IP address", s)
		}
		m.Addresses = append(m.Addresses, a.Unmap())
	}
	if fm.Created != "" {
		t, err := time.Parse(time.RFC3339, fm.Created)
		if err != nil {
			return m, fmt.Errorf("created %q is not an RFC 3339 time", fm.Created)
		}
		m.Created = t
	}
	return m, nil
}

// ParsePrefixes parses CIDRs (the rules' extra ranges).
func ParsePrefixes(cidrs []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(cidrs))
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(strings.TrimSpace(c))
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR such as fdcc::/16", c)
		}
		if p.Bits() == 0 {
			return nil, fmt.Errorf("%q allows every address: list the ranges machines really use", c)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// CheckPatterns refuses DNS patterns that would allow any name: a bare
// "*" or a wildcard over a top-level domain.
func CheckPatterns(patterns []string) error {
	for _, p := range patterns {
		rest, wild := strings.CutPrefix(p, "*.")
		switch {
		case p == "" || strings.Contains(rest, "*"):
			return fmt.Errorf("%q: only a leading \"*.\" wildcard is allowed", p)
		case wild && !strings.Contains(rest, "."):
			return fmt.Errorf("%q: a wildcard needs at least two labels after it", p)
		}
	}
	return nil
}
