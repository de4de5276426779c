//go:build cgo

package pkcs11

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	p11 "github.com/miekg/pkcs11"

	"github.com/steward-trustd/steward-trustd/signer"
)

// TestGenerateError: a refused C_GenerateKeyPair keeps the PKCS#11 code
// (errors.Is and its CKR name in the text) and says what to do.
func TestGenerateError(t *testing.T) {
	tests := []struct {
		rv   p11.Error
		hint string
	}{
		{p11.CKR_TEMPLATE_INCONSISTENT, "refused the key template"},
		{p11.CKR_ATTRIBUTE_VALUE_INVALID, "refused the key template"},
		{p11.CKR_DEVICE_MEMORY, "out of memory"},
		{p11.CKR_GENERAL_ERROR, "TPM2_PKCS11_LOG_LEVEL=2"},
		{p11.CKR_FUNCTION_FAILED, "its own log on"},
		{p11.CKR_KEY_SIZE_RANGE, "refused to generate the key"},
	}
	for _, tt := range tests {
		t.Run(tt.rv.Error(), func(t *testing.T) {
			err := generateError(fmt.Errorf("call: %w", tt.rv))
			if !errors.Is(err, tt.rv) || !strings.Contains(err.Error(), tt.rv.Error()) || !strings.Contains(err.Error(), tt.hint) {
				t.Fatalf("%v: want %v in the chain and %q in the text", err, tt.rv, tt.hint)
			}
		})
	}
}

// TestDeviceLost: the codes after which a session or the module cannot
// be trusted start a reconnect; CKR_GENERAL_ERROR is one of them (v2.40
// §5.1.1), a refused PIN is not.
func TestDeviceLost(t *testing.T) {
	tests := []struct {
		rv   p11.Error
		lost bool
	}{
		{p11.CKR_GENERAL_ERROR, true},
		{p11.CKR_DEVICE_REMOVED, true},
		{p11.CKR_SESSION_HANDLE_INVALID, true},
		{p11.CKR_PIN_INCORRECT, false},
		{p11.CKR_MECHANISM_INVALID, false},
	}
	for _, tt := range tests {
		if got := deviceLost(tt.rv); got != tt.lost {
			t.Errorf("deviceLost(%v) = %v, want %v", tt.rv, got, tt.lost)
		}
		if got := errors.Is(wrap("C_Sign", tt.rv), signer.ErrDeviceUnavailable); got != tt.lost {
			t.Errorf("wrap(%v) is ErrDeviceUnavailable: %v, want %v", tt.rv, got, tt.lost)
		}
	}
}
