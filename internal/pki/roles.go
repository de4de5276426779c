package pki

import (
	"errors"
	"fmt"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/role"
)

// ParseRoles parses talosctl role names (os:admin, os:operator, ...) with
// Talos's own role set. Unknown roles, os:impersonator (for proxies only)
// and an empty set are refused.
func ParseRoles(names []string) ([]string, error) {
	var clean []string
	for _, n := range names {
		if n = strings.TrimSpace(n); n != "" {
			clean = append(clean, n)
		}
	}
	if len(clean) == 0 {
		return nil, errors.New("no role given: a talosctl certificate needs at least one role, e.g. os:admin (Talos 1.14 rejects an empty role set)")
	}
	set, unknown := role.Parse(clean)
	if len(unknown) > 0 {
		return nil, fmt.Errorf("unknown role(s) %s (known: %s)", strings.Join(unknown, ", "), strings.Join(KnownRoles(), ", "))
	}
	if set.Includes(role.Impersonator) {
		return nil, fmt.Errorf("role %s is for API proxies only and is not issued to talosctl users", role.Impersonator)
	}
	return set.Strings(), nil
}

// KnownRoles lists the roles ParseRoles accepts.
func KnownRoles() []string {
	var out []string
	for _, r := range role.All.Strings() {
		if r != string(role.Impersonator) {
			out = append(out, r)
		}
	}
	return out
}
