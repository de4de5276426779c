package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

// relayLog renders commands as steward-tpm-relay --log-commands logs them.
func relayLog(cmds []command) string {
	var b strings.Builder
	for _, c := range cmds {
		fmt.Fprintf(&b, "time=2026-12-03T18:00:00.000Z level=DEBUG msg=\"TPM command\" command=%s response_code=0x0 took=%s start_us=%d\n",
			c.name, c.took, c.start.UnixMicro())
	}
	return b.String()
}

// lockstep is n signatures, each PolicyPCR (1 ms), PolicyCommandCode
// (1 ms) and Sign (60 ms), with idle between every two commands.
func lockstep(n int, idle time.Duration) []command {
	var cmds []command
	at := time.UnixMicro(1_800_000_000_000_000)
	for range n {
		for _, c := range []command{{name: "PolicyPCR", took: time.Millisecond}, {name: "PolicyCommandCode", took: time.Millisecond}, {name: "Sign", took: 60 * time.Millisecond}} {
			c.start = at
			cmds = append(cmds, c)
			at = at.Add(c.took + idle)
		}
	}
	return cmds
}

func TestSummary(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		idle           time.Duration
		wantSignatures int
		wantBusy       float64 // share of the window: from the first Sign's start to the last one's end
		wantGap        time.Duration
	}{
		{"never idle", 0, 6, 1, 2 * time.Millisecond},
		{"1 ms between commands", time.Millisecond, 6, 432.0 / 450, 5 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cmds, err := parse(strings.NewReader(relayLog(lockstep(10, tt.idle))))
			if err != nil || len(cmds) != 30 {
				t.Fatalf("parse: %d commands, %v", len(cmds), err)
			}
			s, err := summarize(cmds, 2, 1)
			if err != nil {
				t.Fatal(err)
			}
			busy := float64(s.busy) / float64(s.span)
			if s.signatures != tt.wantSignatures || busy < tt.wantBusy-0.01 || busy > tt.wantBusy+0.01 || s.quantile(0.5) != tt.wantGap {
				t.Fatalf("signatures %d, busy %.3f, gap %v; want %d, %.3f, %v", s.signatures, busy, s.quantile(0.5), tt.wantSignatures, tt.wantBusy, tt.wantGap)
			}
		})
	}
}

func TestRunRefusesAShortLog(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	if code := run(nil, strings.NewReader(relayLog(lockstep(3, 0))), &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "too few") {
		t.Fatalf("exit %d, %q", code, errOut.String())
	}
	if code := run([]string{"-skip", "1", "-tail", "0"}, strings.NewReader(relayLog(lockstep(4, 0))), &out, &errOut); code != 0 || !strings.Contains(out.String(), "device busy 1.000") {
		t.Fatalf("exit %d, %q %q", code, out.String(), errOut.String())
	}
}
