package server

import (
	"log/slog"
	"sync"
	"time"
)

// stateLog writes one log line per change of state, never one per event:
// under attack a limit is hit thousands of times a second, and a log line
// each time would be a second attack, on the disk. A state that is set
// or cleared is logged once it has held for hold (on Sweep); one that
// flapped meanwhile is logged once, with the number of transitions. The
// onChange hook (metrics) sees every transition at once.
type stateLog struct {
	log      *slog.Logger
	quiet    time.Duration // an event-driven state ends after this long without events
	hold     time.Duration // a set state is logged once it has held this long
	now      func() time.Time
	onChange func(key string, on bool)

	mu     sync.Mutex
	states map[string]*heldState
	events map[string]*eventState
}

// heldState is a state set with set: its current value, and what the log
// said last.
type heldState struct {
	on, logged bool
	since      time.Time // of the current value
	first      time.Time // of the first transition since the last log line
	flips      int       // transitions since the last log line
	msg        string
}

type eventState struct {
	last  time.Time
	count int
	msg   string
}

func newStateLog(log *slog.Logger, quiet, hold time.Duration) *stateLog {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &stateLog{log: log, quiet: quiet, hold: hold, now: time.Now,
		states: map[string]*heldState{}, events: map[string]*eventState{}}
}

// set records a state that is on or off; Sweep logs the change once it
// has held (a warning with msg when it turns on, an info line when it
// turns off).
func (s *stateLog) set(key string, on bool, msg string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	st := s.states[key]
	if st == nil {
		st = &heldState{}
		s.states[key] = st
	}
	changed := st.on != on
	if changed {
		st.on, st.since, st.msg = on, s.now(), msg
		if st.flips == 0 {
			st.first = st.since
		}
		st.flips++
	}
	s.mu.Unlock()
	if changed && s.onChange != nil {
		s.onChange(key, on)
	}
}

// event records one occurrence; the first after a quiet period is logged
// with attrs, and Sweep logs the end of the episode with its count.
func (s *stateLog) event(key, msg string, attrs ...any) {
	if s == nil {
		return
	}
	s.mu.Lock()
	e, active := s.events[key]
	if !active {
		e = &eventState{msg: msg}
		s.events[key] = e
	}
	e.last = s.now()
	e.count++
	s.mu.Unlock()
	if !active {
		s.log.Warn(msg, append([]any{"state", key}, attrs...)...)
	}
}

// Sweep logs the states that changed and have held since, and ends the
// event episodes without an event for the quiet period.
func (s *stateLog) Sweep() {
	if s == nil {
		return
	}
	s.sweepStates()
	s.mu.Lock()
	var ended []*eventState
	var keys []string
	for k, e := range s.events {
		if s.now().Sub(e.last) >= s.quiet {
			ended = append(ended, e)
			keys = append(keys, k)
			delete(s.events, k)
		}
	}
	s.mu.Unlock()
	for i, e := range ended {
		s.log.Info("cleared: "+e.msg, "state", keys[i], "events", e.count)
	}
}

// stateLine is one log line of a state that changed.
type stateLine struct {
	key, msg string
	on       bool
	flips    int
}

func (s *stateLog) sweepStates() {
	s.mu.Lock()
	var lines []stateLine
	now := s.now()
	for k, st := range s.states {
		if st.due(now, s.hold) {
			lines = append(lines, stateLine{key: k, msg: st.msg, on: !st.logged, flips: st.flips})
			st.logged, st.flips = !st.logged, 0
		}
	}
	s.mu.Unlock()
	for _, l := range lines {
		attrs := []any{"state", l.key}
		if l.flips > 1 {
			// It flapped: one line for all of it (the metric has each).
			attrs = append(attrs, "transitions", l.flips)
		}
		if l.on {
			s.log.Warn(l.msg, attrs...)
		} else {
			s.log.Info("cleared: "+l.msg, attrs...)
		}
	}
}

// due reports whether the log must now say the opposite of what it said
// last: a state is reported on once it has held for hold, or has kept
// flapping for hold since its first transition; it is reported cleared
// once it has been off for hold.
func (st *heldState) due(now time.Time, hold time.Duration) bool {
	switch {
	case st.flips == 0:
		return false
	case st.logged:
		return !st.on && now.Sub(st.since) >= hold
	default:
		return (st.on && now.Sub(st.since) >= hold) || (st.flips >= 2 && now.Sub(st.first) >= hold)
	}
}
