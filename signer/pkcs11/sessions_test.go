package pkcs11

import (
	"strconv"
	"testing"
)

// TestSessionLimit: the token's ulMaxSessionCount is a CK_ULONG read as
// unsigned and clamped; opencryptoki's (CK_ULONG)-2 made the pool size
// negative (make(chan) panicked) before.
func TestSessionLimit(t *testing.T) {
	tests := []struct {
		name       string
		configured int
		tokenMax   uint
		want       int
	}{
		{"opencryptoki soft token (CK_ULONG)-2", 0, ^uint(0) - 1, DefaultMaxSessions},
		{"opencryptoki, configured 4", 4, ^uint(0) - 1, 4},
		{"CK_UNAVAILABLE_INFORMATION", 0, ckUnavailableInformation, DefaultMaxSessions},
		{"CK_EFFECTIVELY_INFINITE", 3, ckEffectivelyInfinite, 3},
		{"huge count above int range", 2, 1 << (strconv.IntSize - 1), 2},
		{"small HSM: 3 sessions, one is the anchor", 0, 3, 2},
		{"one session only", 0, 1, DefaultMaxSessions},
		{"two sessions", 8, 2, 1},
		{"token allows more than configured", 2, 100, 2},
		{"negative configured means default", -5, 1000, DefaultMaxSessions},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := sessionLimit(tt.configured, tt.tokenMax)
			if got != tt.want || got < 1 {
				t.Fatalf("sessionLimit(%d, %d) = %d, want %d", tt.configured, tt.tokenMax, got, tt.want)
			}
			_ = make(chan struct{}, got) // what newSigner does with it
		})
	}
}
