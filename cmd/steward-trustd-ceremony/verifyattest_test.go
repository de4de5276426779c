package main

import (
	"slices"
	"testing"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// TestExpectSelection: the verifier expects the selection the key was
// made with — PCR 7 by default, --pcrs, or PCR 11 with an empty ref for
// --systemd-compatible — and binds the expected policy to it; a
// resettable PCR or a contradiction is a usage error.
func TestExpectSelection(t *testing.T) {
	auth := []string{"file:/a.key"}
	tests := []struct {
		name     string
		e        expectFlags
		wantPCRs []int
		wantMode string
		wantErr  bool
	}{
		{"default PCR 7", expectFlags{authorities: auth}, []int{7}, "v2", false},
		{"--pcrs 0,7", expectFlags{authorities: auth, pcrs: "7,0"}, []int{0, 7}, "v2", false},
		{"--pcrs without authorities", expectFlags{pcrs: "0,7"}, []int{0, 7}, "v2", false},
		{"--systemd-compatible", expectFlags{authorities: auth, systemd: true}, []int{11}, "systemd", false},
		{"--systemd-compatible with --pcrs", expectFlags{authorities: auth, systemd: true, pcrs: "11"}, nil, "", true},
		{"--systemd-compatible without authorities", expectFlags{systemd: true}, nil, "", true},
		{"resettable PCR", expectFlags{pcrs: "7,16"}, nil, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pcrs, b, err := tt.e.selection()
			if tt.wantErr {
				if cli.ExitCode(err) != cli.ExitUsage {
					t.Fatalf("selection = %v, %v, want a usage error", pcrs, err)
				}
				return
			}
			if err != nil || !slices.Equal(pcrs, tt.wantPCRs) || b.Mode() != tt.wantMode {
				t.Fatalf("selection = %v, %v, %v; want %v, %s", pcrs, b, err, tt.wantPCRs, tt.wantMode)
			}
			if want := tt.wantPCRs; tt.wantMode == "v2" && b.Ref() != mustRef(t, want) {
				t.Fatalf("binding %v does not name the selection %v", b, want)
			}
		})
	}
}

func mustRef(t *testing.T, pcrs []int) string {
	t.Helper()
	b, err := tpmpolicy.BindingForPCRs(pcrs)
	if err != nil {
		t.Fatal(err)
	}
	return b.Ref()
}
