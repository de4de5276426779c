package signer

import (
	"context"
	"crypto"
	"fmt"
	"sort"
	"strings"
)

// Registry opens key URIs with the backend registered for their scheme.
// It holds no global state: cmd/ builds one with the backends it links.
type Registry struct {
	backends map[string]Backend
}

// NewRegistry returns a registry of the given backends. Two backends with
// the same scheme are a programming error and are reported as such.
func NewRegistry(backends ...Backend) (*Registry, error) {
	r := &Registry{backends: make(map[string]Backend, len(backends))}
	for _, b := range backends {
		s := b.Scheme()
		if _, dup := r.backends[s]; dup {
			return nil, fmt.Errorf("signer backend %q registered twice", s)
		}
		r.backends[s] = b
	}
	return r, nil
}

// Schemes lists the registered schemes, sorted.
func (r *Registry) Schemes() []string {
	out := make([]string, 0, len(r.backends))
	for s := range r.backends {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// Backend returns the backend for uri's scheme.
func (r *Registry) Backend(uri string) (Backend, error) {
	scheme, _, ok := strings.Cut(uri, ":")
	if !ok || scheme == "" {
		return nil, fmt.Errorf("%w: no scheme (want one of %s, e.g. file:/etc/steward-trustd/certs/os-ca.key)", ErrInvalidURI, strings.Join(r.Schemes(), ", "))
	}
	b, ok := r.backends[scheme]
	if !ok {
		return nil, fmt.Errorf("%w: unknown scheme %q (this build supports %s)", ErrInvalidURI, scheme, strings.Join(r.Schemes(), ", "))
	}
	return b, nil
}

// Open opens the existing key uri names.
func (r *Registry) Open(ctx context.Context, uri string) (Signer, error) {
	b, err := r.Backend(uri)
	if err != nil {
		return nil, err
	}
	return b.Open(ctx, uri)
}

// Generate creates a new key at uri.
func (r *Registry) Generate(ctx context.Context, uri string, alg Algorithm) (Signer, error) {
	b, err := r.Backend(uri)
	if err != nil {
		return nil, err
	}
	return b.Generate(ctx, uri, alg)
}

// Import moves key into the backend at uri.
func (r *Registry) Import(ctx context.Context, uri string, key crypto.Signer) (Signer, error) {
	b, err := r.Backend(uri)
	if err != nil {
		return nil, err
	}
	return b.Import(ctx, uri, key)
}
