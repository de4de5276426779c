package server

import (
	"slices"
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
	reloadFailed   *prometheus.GaugeVec
	signerInflight prometheus.Gauge
	ready          prometheus.Gauge
	connsOpen      *prometheus.GaugeVec
	connsRefused   *prometheus.CounterVec
	connsClosed    *prometheus.CounterVec
	streamsReset   *prometheus.CounterVec
	tokenUsed      *prometheus.CounterVec
	connsLimit     *prometheus.GaugeVec
	connsAbandoned *prometheus.CounterVec
	// front door, round two
	acceptErrors     *prometheus.CounterVec
	tokenBadRequests *prometheus.CounterVec
	frontDoorState   *prometheus.GaugeVec
	frontDoorChanges *prometheus.CounterVec
	backend          string
	gate             *gateMetrics
	lint             *lintMetrics
}

// NewMetrics creates the collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer, backend string, extractable bool) *Metrics {
	m := &Metrics{
		backend: backend,
		issued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustd_certificates_issued_total", Help: "Worker serving certificates issued.",
		}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustd_requests_denied_total", Help: "Certificate requests refused, by reason (auth, policy, bad_csr, oversized, rate_limit, saturated, signer, other, lint, log).",
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
		reloadFailed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "trustd_reload_failed", Help: "1 while the cert dir holds a changed file set that was refused (the daemon runs on the previous one), by file set; 0 after a good reload or when the files are back.",
		}, []string{"what"}),
		signerInflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustd_signer_inflight", Help: "Requests holding the signer (those waiting in line: trustd_signer_queued).",
		}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "trustd_signer_ready", Help: "1 when the signer signed successfully recently, else 0.",
		}),
	}
	m.addFrontDoor()
	ext := "false"
	if extractable {
		ext = "true"
	}
	m.signerInfo.WithLabelValues(backend, ext).Set(1)
	// Every label value an alert rule uses exists from the start at 0,
	// so that increase() sees the first event.
	initLabels(m.denied, "auth", "policy", "bad_csr", "oversized", "rate_limit", "saturated", "signer", "other", "lint", "log")
	initLabels(m.denied, "authorizer", "authorizer_unavailable")
	for _, what := range []string{"credentials", "serving", reloadTrust, reloadToken} {
		initLabels(m.reloads.MustCurryWith(prometheus.Labels{"what": what}), "ok", "error")
		m.reloadFailed.WithLabelValues(what).Set(0)
	}
	for _, kind := range []string{"policy", "device", "auth", "options", "other"} {
		m.signerErrors.WithLabelValues(backend, kind)
	}
	reg.MustRegister(m.issued, m.denied, m.signerLatency, m.signerErrors, m.caExpiry, m.servingExpiry,
		m.signerInfo, m.reloads, m.reloadFailed, m.signerInflight, m.ready, m.connsOpen, m.connsRefused, m.connsClosed,
		m.streamsReset, m.tokenUsed, m.connsLimit, m.connsAbandoned,
		m.acceptErrors, m.tokenBadRequests, m.frontDoorState, m.frontDoorChanges)
	m.gate = newGateMetrics(reg)
	m.lint = newLintMetrics(reg)
	return m
}

// addFrontDoor creates the collectors of the front door: connections,
// streams and tokens.
func (m *Metrics) addFrontDoor() {
	m.connsOpen = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "trustd_connections_open", Help: "Open connections on the SecurityService port, by state (authenticated: carrying a request that passed the token and CSR checks; idle: served, none in flight; unauthenticated: any other).",
	}, []string{"state"})
	m.connsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustd_connections_refused_total", Help: "Connections closed at once when accepted, by the limit that refused them (per_address; no_data: silent after TRUSTD_DEFER_ACCEPT; no_room).",
	}, []string{"limit"})
	m.connsClosed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustd_connections_closed_total", Help: "Open connections closed by a limit (unauthenticated_evicted, auth_timeout, handshake_timeout, first_message_timeout, request_idle_timeout, signer_not_ready).",
	}, []string{"limit"})
	m.streamsReset = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustd_streams_reset_total", Help: "Request streams ended by the daemon before their message arrived, by reason (first_message_timeout).",
	}, []string{"reason"})
	m.connsLimit = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "trustd_connections_limit", Help: "Configured connection bounds (max_connections, max_unauthenticated, per_address), for alerts on trustd_connections_open.",
	}, []string{"limit"})
	m.connsAbandoned = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustd_connections_abandoned_total",
		Help: "Connections without a valid token that ended without any request, by stage (handshake, before_request): the client left, or gRPC closed it for a protocol violation such as a header list far over the bound.",
	}, []string{"stage"})
	m.tokenUsed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustd_token_used_total", Help: "Requests authenticated, by the fingerprint of the token that matched: the first 16 hex digits of its SHA-256 (printf %s TOKEN | sha256sum | cut -c1-16); never the token.",
	}, []string{"fingerprint"})
	// Every label value an alert rule uses exists from the start at 0,
	// so that increase() sees the first event.
	initLabels(m.connsRefused, closedPerAddress)
	initLabels(m.connsClosed, closedEvicted, closedAuthTimeout, closedHandshake, closedFirstMessage, closedNotReady)
	initLabels(m.streamsReset, closedFirstMessage)
	initLabels(m.connsAbandoned, abandonedHandshake, abandonedBeforeRequest)
	m.connsOpen.WithLabelValues("unauthenticated")
	m.connsOpen.WithLabelValues("authenticated")
	m.addFrontDoorStates()
}

// addFrontDoorStates creates the collectors of the front door's states,
// accept failures and malformed requests under a valid token.
func (m *Metrics) addFrontDoorStates() {
	m.acceptErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustd_accept_errors_total", Help: "Failed accepts on the SecurityService port, by kind (fd_exhausted: out of file descriptors; other); the port retries.",
	}, []string{"kind"})
	m.tokenBadRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustd_token_bad_requests_total", Help: "Malformed requests (empty or invalid CSR) under a valid token, by the token's fingerprint (as trustd_token_used_total): a client that holds the token misbehaves.",
	}, []string{"fingerprint"})
	m.frontDoorState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "trustd_front_door_state", Help: "1 while a front-door state holds (evicting, connections_full, accept_failing), else 0.",
	}, []string{"state"})
	m.frontDoorChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "trustd_front_door_state_changes_total", Help: "Transitions of each front-door state, every one (the log reports a state once it has held).",
	}, []string{"state"})
	initLabels(m.acceptErrors, acceptFDExhausted, acceptOther)
	initLabels(m.frontDoorChanges, frontStates()...)
	initLabels(m.connsRefused, closedNoData, closedNoRoom)
	initLabels(m.connsClosed, closedRequestIdle)
	m.connsOpen.WithLabelValues(stateIdle)
	for _, st := range frontStates() {
		m.frontDoorState.WithLabelValues(st)
	}
}

func initLabels(c *prometheus.CounterVec, values ...string) {
	for _, v := range values {
		c.WithLabelValues(v)
	}
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
	case "denied_oversized":
		m.denied.WithLabelValues("oversized").Inc()
	case "denied_policy":
		m.denied.WithLabelValues("policy").Inc()
	case "denied_rate_limit":
		m.denied.WithLabelValues("rate_limit").Inc()
	case "denied_saturated":
		m.denied.WithLabelValues("saturated").Inc()
	case "signer_error":
		m.denied.WithLabelValues("signer").Inc()
	case "authorizer_unavailable":
		m.denied.WithLabelValues("authorizer_unavailable").Inc()
	case "denied_lint":
		m.denied.WithLabelValues("lint").Inc()
	case "log_error":
		m.denied.WithLabelValues("log").Inc()
	default:
		m.denied.WithLabelValues(otherDenial(o)).Inc()
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
	m.observeSignerError(kind)
}

// observeSignerError counts a failed signature, for a request or a
// readiness probe, by kind (signer.ErrorKind).
func (m *Metrics) observeSignerError(kind string) {
	if m != nil {
		m.signerErrors.WithLabelValues(m.backend, kind).Inc()
	}
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

// ObserveReload counts a reload of what ("credentials", "serving") with ok
// or not, and keeps trustd_reload_failed at 1 until the next good one.
func (m *Metrics) ObserveReload(what string, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.reloads.WithLabelValues(what, result).Inc()
	m.SetReloadFailed(what, err != nil)
}

// SetReloadFailed sets trustd_reload_failed{what}: 1 while a refused file
// set is in the cert dir.
func (m *Metrics) SetReloadFailed(what string, failed bool) {
	if m == nil {
		return
	}
	v := 0.0
	if failed {
		v = 1
	}
	m.reloadFailed.WithLabelValues(what).Set(v)
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

// SetTokens creates the per-token counters at 0 for the fingerprints now
// and drops those of tokens a reload removed (in was, not in now): a
// frozen series would read as a token no worker uses. A token kept
// across a reload keeps its count, whatever its line.
func (m *Metrics) SetTokens(was, now []string) {
	if m == nil {
		return
	}
	for _, fp := range now {
		m.tokenUsed.WithLabelValues(fp)
		m.tokenBadRequests.WithLabelValues(fp)
	}
	for _, fp := range was {
		if !slices.Contains(now, fp) {
			m.tokenUsed.DeleteLabelValues(fp)
			m.tokenBadRequests.DeleteLabelValues(fp)
		}
	}
}

func (m *Metrics) tokenMatched(fingerprint string) {
	if m != nil {
		m.tokenUsed.WithLabelValues(fingerprint).Inc()
	}
}

func (m *Metrics) setConnLimits(c ConnLimits) {
	if m != nil {
		m.connsLimit.WithLabelValues("max_connections").Set(float64(c.MaxConnections))
		m.connsLimit.WithLabelValues("max_unauthenticated").Set(float64(c.MaxUnauthenticated))
		m.connsLimit.WithLabelValues("per_address").Set(float64(c.MaxPerAddress))
	}
}

// connMoved moves a connection between the states of
// trustd_connections_open ("" is none: opened or gone).
func (m *Metrics) connMoved(from, to string) {
	if m == nil {
		return
	}
	if from != "" {
		m.connsOpen.WithLabelValues(from).Dec()
	}
	if to != "" {
		m.connsOpen.WithLabelValues(to).Inc()
	}
}

func (m *Metrics) acceptFailed(kind string) {
	if m != nil {
		m.acceptErrors.WithLabelValues(kind).Inc()
	}
}

func (m *Metrics) tokenBadRequest(fingerprint string) {
	if m != nil {
		m.tokenBadRequests.WithLabelValues(fingerprint).Inc()
	}
}

// frontState publishes a front-door state as it changes (the log reports
// it once it has held; the metric has every transition).
func (m *Metrics) frontState(state string, on bool) {
	if m == nil {
		return
	}
	v := 0.0
	if on {
		v = 1
	}
	m.frontDoorState.WithLabelValues(state).Set(v)
	m.frontDoorChanges.WithLabelValues(state).Inc()
}

func (m *Metrics) connRefused(limit string) {
	if m != nil {
		m.connsRefused.WithLabelValues(limit).Inc()
	}
}

func (m *Metrics) connClosed(limit string) {
	if m != nil {
		m.connsClosed.WithLabelValues(limit).Inc()
	}
}

func (m *Metrics) connsClosedN(limit string, n int) {
	if m != nil {
		m.connsClosed.WithLabelValues(limit).Add(float64(n))
	}
}

func (m *Metrics) connAbandoned(stage string) {
	if m != nil {
		m.connsAbandoned.WithLabelValues(stage).Inc()
	}
}

func (m *Metrics) streamReset(reason string) {
	if m != nil {
		m.streamsReset.WithLabelValues(reason).Inc()
	}
}
