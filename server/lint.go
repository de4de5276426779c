package server

import (
	"errors"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-trustd/steward-trustd/internal/certlint"
	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// lintError is a worker certificate the pre-issuance lints refused
// (internal/certlint): PermissionDenied, outcome denied_lint. The signing
// device was never asked.
type lintError struct{ err *certlint.Error }

func (e *lintError) Error() string { return e.err.Error() }
func (e *lintError) Unwrap() error { return e.err }

// lintMetrics count lint results by lint name. The names come from the
// fixed lint registry, so the label set is bounded.
type lintMetrics struct {
	failures *prometheus.CounterVec
	warnings *prometheus.CounterVec
}

func newLintMetrics(reg prometheus.Registerer) *lintMetrics {
	m := &lintMetrics{
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustd_lint_failures_total", Help: "Worker certificates refused before signing, by failed lint (a request may fail several).",
		}, []string{"lint"}),
		warnings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustd_lint_warnings_total", Help: "Worker certificates issued with a lint warning, by lint.",
		}, []string{"lint"}),
	}
	reg.MustRegister(m.failures, m.warnings)
	return m
}

// lintWarned remembers which lints have warned, so that each is logged
// once per process rather than once per certificate.
type lintWarned struct {
	mu   sync.Mutex
	seen map[string]bool
}

// first reports whether name warns for the first time.
func (w *lintWarned) first(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen[name] {
		return false
	}
	if w.seen == nil {
		w.seen = map[string]bool{}
	}
	w.seen[name] = true
	return true
}

// observeLint accounts for the lints of one issuance: a lint refusal
// becomes a lintError (and is not a signer failure: the device was not
// asked), warnings are counted and logged once per lint.
func (s *Service) observeLint(cert *pki.Issued, err error) error {
	var le *certlint.Error
	if errors.As(err, &le) {
		if s.metrics != nil {
			for _, n := range le.Names() {
				s.metrics.lint.failures.WithLabelValues(n).Inc()
			}
		}
		return &lintError{err: le}
	}
	if cert == nil {
		return nil
	}
	for _, n := range cert.LintWarnings {
		if s.metrics != nil {
			s.metrics.lint.warnings.WithLabelValues(n).Inc()
		}
		if s.lintWarned.first(n) {
			s.log.Warn("certificate lint warning (logged once per lint; trustd_lint_warnings_total counts them)", slog.String("lint", n))
		}
	}
	return nil
}
