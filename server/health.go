package server

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/sha256"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/steward-trustd/steward-trustd/signer"
)

// Readiness tells whether the signer works, from the outcome of real
// signatures, and only probes the device itself when there has been no
// signature for a while: a TPM on a real chip signs a handful of times a
// second, and a probe every few seconds must not compete with workers.
type Readiness struct {
	signer  signer.Signer
	window  time.Duration
	now     func() time.Time
	health  *health.Server
	metrics *Metrics

	probes     sync.WaitGroup // probe signatures still running
	checks     []func() error
	onNotReady func()
	log        *slog.Logger

	mu          sync.Mutex
	signerUp    bool // as last published
	lastSuccess time.Time
	lastFailure time.Time
	lastProbe   time.Time
	probing     bool
}

// NewReadiness tracks s; a success within window counts as ready.
func NewReadiness(s signer.Signer, window time.Duration, now func() time.Time, m *Metrics) *Readiness {
	if now == nil {
		now = time.Now
	}
	if window <= 0 {
		window = 30 * time.Second
	}
	r := &Readiness{signer: s, window: window, now: now, health: health.NewServer(), metrics: m}
	r.publish(false)
	return r
}

// AddCheck adds a condition besides the signer for readiness: check
// returns why the daemon cannot take workers now, or nil. Call it before
// Run.
func (r *Readiness) AddCheck(check func() error) { r.checks = append(r.checks, check) }

// OnSignerNotReady sets f to run each time the signer turns not ready
// (the daemon then closes its open connections, so that workers' retries
// reach a healthy replica), and log to receive one line per change.
// Call it before Run.
func (r *Readiness) OnSignerNotReady(f func(), log *slog.Logger) { r.onNotReady, r.log = f, log }

// checkErr returns the first failing check, or nil.
func (r *Readiness) checkErr() error {
	for _, c := range r.checks {
		if err := c(); err != nil {
			return err
		}
	}
	return nil
}

// Observe records the outcome of a signature made for a request.
func (r *Readiness) Observe(err error) {
	r.mu.Lock()
	if err == nil {
		r.lastSuccess = r.now()
	} else {
		r.lastFailure = r.now()
	}
	ready := r.readyLocked()
	r.mu.Unlock()
	r.publish(ready)
}

func (r *Readiness) readyLocked() bool {
	return !r.lastSuccess.IsZero() && r.lastSuccess.After(r.lastFailure) && r.now().Sub(r.lastSuccess) < r.window
}

// Ready reports readiness, probing the signer at most once per window
// when no request has signed within it.
func (r *Readiness) Ready(ctx context.Context) bool {
	r.mu.Lock()
	if r.readyLocked() {
		r.mu.Unlock()
		return true
	}
	if r.probing || (r.now().Sub(r.lastProbe) < r.window/2 && !r.lastProbe.IsZero()) {
		ready := r.readyLocked()
		r.mu.Unlock()
		return ready
	}
	r.probing = true
	r.lastProbe = r.now()
	r.mu.Unlock()
	select {
	case err := <-r.probe():
		return err == nil
	case <-ctx.Done():
		// The caller gave up (a kubelet probe timing out, shutdown): that
		// says nothing about the signer. The probe's own answer counts
		// when it comes; a device that never answers loses readiness
		// once the window has passed without a success.
		return false
	}
}

// probe makes one throw-away signature in the background and records its
// outcome when it completes, whoever still waits for it.
func (r *Readiness) probe() <-chan error {
	done := make(chan error, 1)
	r.probes.Add(1)
	go func() {
		defer r.probes.Done()
		err := probeSign(r.signer)
		if err != nil {
			// A probe failure is a signer failure like a request's: the
			// alerts on trustd_signer_errors_total must fire without traffic.
			r.metrics.observeSignerError(signer.ErrorKind(err))
		}
		r.mu.Lock()
		r.probing = false
		r.mu.Unlock()
		r.Observe(err)
		done <- err
	}()
	return done
}

// Run re-evaluates readiness every interval until ctx ends, so that the
// gRPC health status and the metric follow the signer without traffic.
//
// Each evaluation waits for a probe at most one window: a device that
// hangs must turn the status NOT_SERVING, not stall Run with the last
// status still published.
//
// Before returning it waits (up to probeDrain) for a probe signature still
// on the device, so that the signer is not closed under it.
func (r *Readiness) Run(ctx context.Context, interval time.Duration) {
	evaluate := func() {
		pctx, cancel := context.WithTimeout(ctx, r.window)
		defer cancel()
		if ready := r.Ready(pctx); ctx.Err() == nil { // not at shutdown
			r.publish(ready)
		}
	}
	evaluate()
	every(ctx, interval, evaluate)
	done := make(chan struct{})
	go func() { r.probes.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(probeDrain):
	}
}

// probeDrain bounds how long shutdown waits for a probe signature.
const probeDrain = 5 * time.Second

func (r *Readiness) publish(signerReady bool) {
	r.signerChanged(signerReady)
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if signerReady && r.checkErr() == nil {
		st = healthpb.HealthCheckResponse_SERVING
	}
	r.health.SetServingStatus("", st)
	r.health.SetServingStatus("securityapi.SecurityService", st)
	r.metrics.setReady(signerReady)
}

// signerChanged logs a change of the signer's readiness and, when it
// turns not ready, runs the OnSignerNotReady hook.
func (r *Readiness) signerChanged(ready bool) {
	r.mu.Lock()
	was := r.signerUp
	r.signerUp = ready
	r.mu.Unlock()
	if was == ready || r.log == nil {
		return
	}
	if ready {
		r.log.Info("signer ready: accepting workers")
		return
	}
	r.log.Warn("signer not ready: closing open connections (GOAWAY) so that workers retry on a healthy replica; see the 'signer failing' line for the cause")
	if r.onNotReady != nil {
		r.onNotReady()
	}
}

// RegisterHealth adds the gRPC health service to g.
func (r *Readiness) RegisterHealth(g *grpc.Server) { healthpb.RegisterHealthServer(g, r.health) }

// probeSign makes one throw-away signature.
func probeSign(s signer.Signer) error {
	msg := []byte("steward-trustd readiness probe")
	if _, ok := s.Public().(ed25519.PublicKey); ok {
		_, err := s.Sign(nil, msg, crypto.Hash(0))
		return err
	}
	d := sha256.Sum256(msg)
	_, err := s.Sign(nil, d[:], crypto.SHA256)
	return err
}

// HealthHandler serves /healthz (the process answers), /readyz (the
// signer works), /metrics, and the gRPC health service for Kubernetes
// gRPC probes, on one plaintext address: probes cannot speak TLS to 50001.
// Serve it with an http.Server that allows unencrypted HTTP/2.
func HealthHandler(r *Readiness, gatherer prometheus.Gatherer) http.Handler {
	grpcHealth := grpc.NewServer()
	r.RegisterHealth(grpcHealth)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, req *http.Request) {
		ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
		defer cancel()
		if !r.Ready(ctx) {
			http.Error(w, "signer not ready", http.StatusServiceUnavailable)
			return
		}
		if err := r.checkErr(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.ProtoMajor == 2 && strings.HasPrefix(req.Header.Get("Content-Type"), "application/grpc") {
			grpcHealth.ServeHTTP(w, req)
			return
		}
		mux.ServeHTTP(w, req)
	})
}

// NewHealthServer returns an http.Server for HealthHandler on addr, with
// HTTP/1.1 and unencrypted HTTP/2 (for gRPC health checks).
func NewHealthServer(addr string, h http.Handler) *http.Server {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Server{Addr: addr, Handler: h, Protocols: &p, ReadHeaderTimeout: 5 * time.Second}
}
