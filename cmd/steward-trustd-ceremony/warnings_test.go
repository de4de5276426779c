package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
)

func TestWarnSummaryLine(t *testing.T) {
	many := make([]string, maxWarnings+2)
	for i := range many {
		many[i] = fmt.Sprintf("w%d", i)
	}
	tests := []struct {
		name string
		msgs []string
		want string
	}{
		{"none", nil, ""},
		{"one", []string{"a"}, "1 warning: a"},
		{"repeated", []string{"a", "b", "a"}, "3 warnings: a (2 times); b"},
		{"bounded", many, fmt.Sprintf("%d warnings: w0; ", len(many))},
		{"bounded tail", many, "; and 2 more"},
	}
	for _, tt := range tests {
		var s warnSummary
		for _, m := range tt.msgs {
			s.add(m)
		}
		got := s.line()
		if tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestWarningsSummarisedAtTheEnd: a device warning logged mid-command (a
// file key held in memory) is repeated as the last line of stderr.
func TestWarningsSummarisedAtTheEnd(t *testing.T) {
	key, ca := ceremonyDir(t)
	code, _, stderr := runCmd(t, "server-cert", "--signer", key, "--ca", ca, "--san", "10.5.0.2", "--out", t.TempDir())
	if code != cli.ExitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "1 warning: the OS CA private key is held in process memory") {
		t.Errorf("last stderr line %q, want the one-line summary", last)
	}
}
