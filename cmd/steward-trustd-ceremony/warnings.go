package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// maxWarnings bounds the distinct warnings the summary keeps.
const maxWarnings = 16

// warnSummary collects the WARN+ lines the devices log during a command,
// so that a warning that scrolled past among the output is repeated in one
// line at the end ("2 warnings: …").
type warnSummary struct {
	mu     sync.Mutex
	msgs   []string
	counts map[string]int
	total  int
}

func (s *warnSummary) add(msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total++
	if s.counts == nil {
		s.counts = map[string]int{}
	}
	if s.counts[msg] == 0 && len(s.msgs) < maxWarnings {
		s.msgs = append(s.msgs, msg)
	}
	s.counts[msg]++
}

// line is the summary, "" without warnings.
func (s *warnSummary) line() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.total == 0 {
		return ""
	}
	parts := make([]string, 0, len(s.msgs)+1)
	for _, m := range s.msgs {
		if n := s.counts[m]; n > 1 {
			m = fmt.Sprintf("%s (%d times)", m, n)
		}
		parts = append(parts, m)
	}
	if len(s.counts) > len(s.msgs) {
		parts = append(parts, fmt.Sprintf("and %d more", len(s.counts)-len(s.msgs)))
	}
	noun := "warnings"
	if s.total == 1 {
		noun = "warning"
	}
	return fmt.Sprintf("%d %s: %s", s.total, noun, strings.Join(parts, "; "))
}

// logger is the ceremony's device logger: WARN and above to stderr, each
// also counted for the summary.
func (s *warnSummary) logger(stderr io.Writer) *slog.Logger {
	return slog.New(summaryHandler{Handler: slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}), s: s})
}

// summaryHandler feeds every record it passes on to a warnSummary.
type summaryHandler struct {
	slog.Handler
	s *warnSummary
}

func (h summaryHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.s.add(r.Message)
	}
	return h.Handler.Handle(ctx, r)
}

func (h summaryHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return summaryHandler{Handler: h.Handler.WithAttrs(as), s: h.s}
}

func (h summaryHandler) WithGroup(name string) slog.Handler {
	return summaryHandler{Handler: h.Handler.WithGroup(name), s: h.s}
}
