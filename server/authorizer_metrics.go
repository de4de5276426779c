package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-trustd/steward-trustd/internal/authz"
)

// AuthorizerMetrics are the authorizer's collectors; nil records nothing.
type AuthorizerMetrics struct {
	decisions *prometheus.CounterVec
	duration  prometheus.Histogram
	errors    *prometheus.CounterVec
	up        prometheus.Gauge
}

// NewAuthorizerMetrics creates the collectors and registers them on reg.
func NewAuthorizerMetrics(reg prometheus.Registerer) *AuthorizerMetrics {
	m := &AuthorizerMetrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustd_authorizer_decisions_total",
			Help: "Authorizer decisions by outcome (allowed, cached, denied_*, error); denials are counted in observe mode too, where the certificate is issued and the audit line says would_deny.",
		}, []string{"outcome"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "trustd_authorizer_duration_seconds",
			Help:    "Time to get one decision from the authorizer (cached allows excluded).",
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2},
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustd_authorizer_errors_total", Help: "Decisions that could not be made, by kind (unreachable, timeout, bad_response, busy).",
		}, []string{"kind"}),
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustd_authorizer_up", Help: "1 while the authorizer's last decision worked, 0 after a failure.",
		}),
	}
	initLabels(m.decisions, append([]string{authz.OutcomeAllowed, "cached", "error"}, authz.Denials()...)...)
	initLabels(m.errors, "unreachable", "timeout", "bad_response", "busy")
	m.up.Set(1)
	reg.MustRegister(m.decisions, m.duration, m.errors, m.up)
	return m
}

func (m *AuthorizerMetrics) decision(outcome string) {
	if m != nil {
		m.decisions.WithLabelValues(outcome).Inc()
	}
}

func (m *AuthorizerMetrics) latency(d time.Duration) {
	if m != nil {
		m.duration.Observe(d.Seconds())
	}
}

func (m *AuthorizerMetrics) failure(kind string) {
	if m != nil {
		m.errors.WithLabelValues(kind).Inc()
	}
}

func (m *AuthorizerMetrics) setUp(up bool) {
	if m == nil {
		return
	}
	if up {
		m.up.Set(1)
	} else {
		m.up.Set(0)
	}
}
