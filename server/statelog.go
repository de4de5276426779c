package server

import (
	"log/slog"
	"sync"
	"time"
)

// stateLog writes one log line per change of state, never one per event:
// under attack a limit is hit thousands of times a second, and a log line
// each time would be a second attack, on the disk.
type stateLog struct {
	log   *slog.Logger
	quiet time.Duration // an event-driven state ends after this long without events
	now   func() time.Time

	mu     sync.Mutex
	on     map[string]bool
	events map[string]*eventState
}

type eventState struct {
	last  time.Time
	count int
	msg   string
}

func newStateLog(log *slog.Logger, quiet time.Duration) *stateLog {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &stateLog{log: log, quiet: quiet, now: time.Now, on: map[string]bool{}, events: map[string]*eventState{}}
}

// set records a state that is on or off; the change is logged (a warning
// with msg when it turns on, an info line when it turns off).
func (s *stateLog) set(key string, on bool, msg string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	changed := s.on[key] != on
	s.on[key] = on
	s.mu.Unlock()
	switch {
	case changed && on:
		s.log.Warn(msg, "state", key)
	case changed:
		s.log.Info("cleared: "+msg, "state", key)
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

// Sweep ends the episodes without an event for the quiet period.
func (s *stateLog) Sweep() {
	if s == nil {
		return
	}
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
