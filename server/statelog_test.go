package server

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
)

// TestStateLogHoldsAndCountsFlaps: a state is logged once it has held
// for the hold time, set and cleared alike; a flapping one is one line
// with its number of transitions, while the hook sees every transition.
func TestStateLogHoldsAndCountsFlaps(t *testing.T) {
	logs := &devtest.LockedBuffer{}
	s := newStateLog(slog.New(slog.NewJSONHandler(logs, nil)), time.Minute, 5*time.Second)
	clock := time.Unix(1000, 0)
	s.now = func() time.Time { return clock }
	hooks := 0
	s.onChange = func(string, bool) { hooks++ }
	steps := []struct {
		at    time.Duration
		set   *bool // nil: only a Sweep
		lines int   // log lines so far
	}{
		{0, ptr(true), 0},
		{time.Second, nil, 0}, // not held yet
		{2 * time.Second, ptr(false), 0},
		{3 * time.Second, ptr(true), 0},
		{4 * time.Second, ptr(false), 0},
		{5 * time.Second, ptr(true), 1}, // flapped for 5 s: one line
		{6 * time.Second, ptr(false), 1},
		{7 * time.Second, ptr(true), 1},
		{8 * time.Second, ptr(false), 1},
		{12 * time.Second, nil, 1}, // off for 4 s only
		{13 * time.Second, nil, 2}, // off for 5 s: cleared
		{30 * time.Second, nil, 2},
	}
	for _, st := range steps {
		clock = time.Unix(1000, 0).Add(st.at)
		if st.set != nil {
			s.set("connections_full", *st.set, "full")
		}
		s.Sweep()
		if n := strings.Count(logs.String(), "\n"); n != st.lines {
			t.Fatalf("at %v: %d log lines, want %d\n%s", st.at, n, st.lines, logs.String())
		}
	}
	if hooks != 8 {
		t.Fatalf("hook saw %d transitions, want 8 (the metric keeps each)", hooks)
	}
	out := logs.String()
	if !strings.Contains(out, `"transitions":5`) || !strings.Contains(out, `"transitions":3`) || !strings.Contains(out, "cleared: full") {
		t.Fatalf("flapping not reported with its count:\n%s", out)
	}
}

func ptr[T any](v T) *T { return &v }
