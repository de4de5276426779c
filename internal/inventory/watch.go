package inventory

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/authz"
)

// FileSource feeds an engine from an inventory file and reloads it when
// its content changes. A file that fails to load leaves the last good
// inventory in force; the failure is logged once per change of state
// and reported to OnReload.
type FileSource struct {
	// Path is the inventory file.
	Path string
	// Interval is how often the file is checked (default 5 s).
	Interval time.Duration
	// Log receives one line per change of state.
	Log *slog.Logger
	// OnReload, if set, learns every load's outcome (metrics).
	OnReload func(err error)

	apply   func(*Parsed) error
	lastSum [sha256.Size]byte
	failing string
}

// Load reads the file once and hands it to apply (and so each changed
// version later); it must succeed before Run, so that nothing starts
// without an inventory. An apply error leaves the last good one.
func (s *FileSource) Load(apply func(*Parsed) error) error {
	s.apply = apply
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	_, err := s.reload()
	return err
}

// Run checks the file every Interval until ctx ends.
func (s *FileSource) Run(ctx context.Context) {
	iv := s.Interval
	if iv <= 0 {
		iv = 5 * time.Second
	}
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.tick()
		}
	}
}

func (s *FileSource) tick() {
	changed, err := s.reload()
	if s.OnReload != nil && (changed || err != nil) {
		s.OnReload(err)
	}
	switch {
	case err != nil && err.Error() != s.failing:
		s.Log.Error("inventory reload failed; the last good inventory stays in force: fix the file", "path", s.Path, "error", err)
		s.failing = err.Error()
	case err == nil && s.failing != "":
		s.Log.Info("inventory reload recovered", "path", s.Path)
		s.failing = ""
	}
}

// reload loads the file if its content changed since the last good load.
func (s *FileSource) reload() (bool, error) {
	data, err := authz.ReadFileLimited(s.Path, MaxFileBytes)
	if err != nil {
		return false, fmt.Errorf("inventory: %w", err)
	}
	sum := sha256.Sum256(data)
	if sum == s.lastSum {
		return false, nil
	}
	p, err := ParseFile(data)
	if err != nil {
		return false, fmt.Errorf("inventory %s: %w", s.Path, err)
	}
	if err := s.apply(p); err != nil {
		return false, err
	}
	s.lastSum = sum
	s.Log.Info("inventory loaded", "path", s.Path, "machines", p.Snapshot.Len())
	return true, nil
}

// Install returns an apply function for FileSource.Load that makes the
// file the engine's whole inventory, with extra added to its rules.
func Install(e *authz.Engine, extra authz.Rules) func(*Parsed) error {
	return func(p *Parsed) error {
		if err := e.SetSnapshot(p.Snapshot); err != nil {
			return err
		}
		e.SetRules(MergeRules(p.Rules, extra))
		return nil
	}
}

// MergeRules adds b's ranges and patterns to a; b's join window wins
// when set.
func MergeRules(a, b authz.Rules) authz.Rules {
	out := authz.Rules{
		ExtraPrefixes: append(append([]netip.Prefix{}, a.ExtraPrefixes...), b.ExtraPrefixes...),
		DNSPatterns:   append(append([]string{}, a.DNSPatterns...), b.DNSPatterns...),
		JoinWindow:    a.JoinWindow,
	}
	if b.JoinWindow > 0 {
		out.JoinWindow = b.JoinWindow
	}
	return out
}
