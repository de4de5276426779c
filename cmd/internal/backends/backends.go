// Package backends assembles the signer registry the binaries use. It is
// the one place that links device backends and opens devices, so that
// signer/ and keystore/ stay free of device-opening code.
package backends

import (
	"log/slog"

	"github.com/steward-trustd/steward-trustd/cmd/internal/tpmdev"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/file"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
)

// Registry returns the signer registry with every backend this build
// supports. logger receives backend warnings (never secrets).
func Registry(logger *slog.Logger) (*signer.Registry, error) {
	return signer.NewRegistry(
		&file.Backend{Logger: logger},
		&pkcs11.Backend{Logger: logger},
		&tpm.Backend{Dial: tpmdev.Dial, Logger: logger},
	)
}
