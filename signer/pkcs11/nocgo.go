//go:build !cgo

package pkcs11

import (
	"context"
	"crypto"
	"errors"
	"log/slog"

	"github.com/steward-trustd/steward-trustd/signer"
)

// errNoCgo is what every operation of a build without cgo returns.
var errNoCgo = errors.New("pkcs11: this binary was built without cgo (CGO_ENABLED=0) and cannot load PKCS#11 modules; rebuild with CGO_ENABLED=1")

// Backend is the PKCS#11 backend of a build without cgo: it parses key
// URIs, so that mistakes are reported as such, and then refuses.
type Backend struct {
	// Logger is unused without cgo; it keeps the cgo build's fields.
	Logger *slog.Logger
	// MaxSessions is unused without cgo.
	MaxSessions int
}

// Scheme implements signer.Backend.
func (b *Backend) Scheme() string { return Scheme }

// Open implements signer.Backend; it always fails without cgo.
func (b *Backend) Open(_ context.Context, uri string) (signer.Signer, error) {
	return nil, refuse(uri)
}

// Generate implements signer.Backend; it always fails without cgo.
func (b *Backend) Generate(_ context.Context, uri string, _ signer.Algorithm) (signer.Signer, error) {
	return nil, refuse(uri)
}

// Import implements signer.Backend; it always fails without cgo.
func (b *Backend) Import(_ context.Context, uri string, _ crypto.Signer) (signer.Signer, error) {
	return nil, refuse(uri)
}

func refuse(uri string) error {
	if _, err := ParseURI(uri); err != nil {
		return err
	}
	return errNoCgo
}
