package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the daemon's Prometheus collectors. They live on a registry
// the caller owns: nothing is registered globally.
type Metrics struct {
	issued         prometheus.Counter
	denied         *prometheus.CounterVec
	signerLatency  *prometheus.HistogramVec
	signerErrors   *prometheus.CounterVec
	caExpiry       prometheus.Gauge
	servingExpiry  prometheus.Gauge
	signerInfo     *prometheus.GaugeVec
	reloads        *prometheus.CounterVec
	signerInflight prometheus.Gauge
	ready          prometheus.Gauge
	backend        string
	gate           *gateMetrics
}

// NewMetrics creates the collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer, backend string, extractable bool) *Metrics {
	m := &Metrics{
		backend: backend,
		issued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustd_certificates_issued_total", Help: "Worker serving certificates issued.",
		}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustd_requests_denied_total", Help: "Certificate requests refused, by reason (auth, policy, bad_csr, rate_limit, saturated, signer, other).",
		}, []string{"reason"}),
		signerLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "trustd_signer_duration_seconds",
			Help:    "Time to issue one certificate through the signer, by backend.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5},
		}, []string{"backend"}),
		signerErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustd_signer_errors_total", Help: "Signer failures by kind (policy, device, auth, options, other).",
		}, []string{"backend", "kind"}),
		caExpiry: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustd_os_ca_expiry_seconds", Help: "Seconds until the issuing OS CA certificate expires.",
		}),
		servingExpiry: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustd_serving_certificate_expiry_seconds", Help: "Seconds until trustd's own serving certificate expires.",
		}),
		signerInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustd_signer_info", Help: "Always 1; labels name the signer backend and whether its key can leave the device.",
		}, []string{"backend", "extractable"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustd_reloads_total", Help: "Reloads of the cert dir, by file set and result (ok, error).",
		}, []string{"what", "result"}),
		signerInflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustd_signer_inflight", Help: "Requests holding the signer (those waiting in line: trustd_signer_queued).",
		}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustd_signer_ready", Help: "1 when the signer signed successfully recently, else 0.",
		}),
	}
	ext := "false"
	if extractable {
		ext = "true"
	}
	m.signerInfo.WithLabelValues(backend, ext).Set(1)
	for _, r := range []string{"auth", "policy", "bad_csr", "rate_limit", "saturated", "signer", "other"} {
		m.denied.WithLabelValues(r)
	}
	reg.MustRegister(m.issued, m.denied, m.signerLatency, m.signerErrors, m.caExpiry, m.servingExpiry,
		m.signerInfo, m.reloads, m.signerInflight, m.ready)
	m.gate = newGateMetrics(reg)
	return m
}

// observeOutcome counts one decision.
func (m *Metrics) observeOutcome(o string) {
	if m == nil {
		return
	}
	switch o {
	case "issued":
		m.issued.Inc()
	case "denied_auth":
		m.denied.WithLabelValues("auth").Inc()
	case "denied_bad_csr":
		m.denied.WithLabelValues("bad_csr").Inc()
	case "denied_policy":
		m.denied.WithLabelValues("policy").Inc()
	case "denied_rate_limit":
		m.denied.WithLabelValues("rate_limit").Inc()
	case "denied_saturated":
		m.denied.WithLabelValues("saturated").Inc()
	case "signer_error":
		m.denied.WithLabelValues("signer").Inc()
	default:
		m.denied.WithLabelValues("other").Inc()
	}
}

func (m *Metrics) observeSign(d time.Duration, kind string) {
	if m == nil {
		return
	}
	if kind == "" {
		m.signerLatency.WithLabelValues(m.backend).Observe(d.Seconds())
		return
	}
	m.signerErrors.WithLabelValues(m.backend, kind).Inc()
}

// SetCAExpiry records when the issuing CA expires.
func (m *Metrics) SetCAExpiry(notAfter time.Time, now time.Time) {
	if m != nil {
		m.caExpiry.Set(notAfter.Sub(now).Seconds())
	}
}

// SetServingExpiry records when the serving certificate expires.
func (m *Metrics) SetServingExpiry(notAfter time.Time, now time.Time) {
	if m != nil {
		m.servingExpiry.Set(notAfter.Sub(now).Seconds())
	}
}

// ObserveReload counts a reload of what ("credentials", "serving") with ok or not.
func (m *Metrics) ObserveReload(what string, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.reloads.WithLabelValues(what, result).Inc()
}

func (m *Metrics) setReady(ok bool) {
	if m == nil {
		return
	}
	if ok {
		m.ready.Set(1)
	} else {
		m.ready.Set(0)
	}
}

func (m *Metrics) inflight(delta float64) {
	if m != nil {
		m.signerInflight.Add(delta)
	}
}
