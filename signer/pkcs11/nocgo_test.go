//go:build !cgo

package pkcs11

import (
	"context"
	"errors"
	"testing"

	"github.com/steward-trustd/steward-trustd/signer"
)

func TestNoCgo(t *testing.T) {
	b := &Backend{}
	good := "pkcs11:token=t;object=k?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-value=1"
	if _, err := b.Open(context.Background(), good); !errors.Is(err, errNoCgo) {
		t.Fatalf("Open = %v, want the no-cgo error", err)
	}
	if _, err := b.Generate(context.Background(), "pkcs11:token=t", signer.ECDSAP256); !errors.Is(err, signer.ErrInvalidURI) {
		t.Fatalf("Generate with a bad URI = %v, want ErrInvalidURI", err)
	}
}
