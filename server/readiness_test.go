package server

import (
	"context"
	"crypto"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/steward-trustd/steward-trustd/signer"
)

// slowSigner signs once release is closed, and says when a Sign started.
type slowSigner struct {
	signer.Signer
	started chan struct{}
	release chan struct{}
}

func (s *slowSigner) Sign(r io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	s.started <- struct{}{}
	<-s.release
	return s.Signer.Sign(r, d, o)
}

// TestReadinessProbeCallerGone: a readiness probe whose caller went away
// (a kubelet probe timing out on a slow but working TPM) is no signer
// failure: no not-ready drain, no error; the probe's own answer counts
// once it arrives.
func TestReadinessProbeCallerGone(t *testing.T) {
	ca := newTestCA(t, signer.ECDSAP256)
	ss := &slowSigner{Signer: ca.signer, started: make(chan struct{}, 1), release: make(chan struct{})}
	clk := newFakeClock()
	m := NewMetrics(prometheus.NewRegistry(), "file", true)
	r := NewReadiness(ss, 30*time.Second, clk.now, m)
	var drains atomic.Int32
	r.OnSignerNotReady(func() { drains.Add(1) }, slog.New(slog.DiscardHandler))
	r.Observe(nil)
	clk.add(31 * time.Second) // no signature within the window: Ready probes
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-ss.started; cancel() }()
	if r.Ready(ctx) {
		t.Fatal("ready with the probe unanswered")
	}
	if n := drains.Load(); n != 0 {
		t.Fatalf("caller's cancel drained connections %d times, want 0", n)
	}
	close(ss.release)
	deadline := time.Now().Add(5 * time.Second)
	for !r.Ready(context.Background()) {
		if time.Now().After(deadline) {
			t.Fatal("the probe's late success was never recorded")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := testutil.ToFloat64(m.signerErrors.WithLabelValues("file", "other")); got != 0 {
		t.Fatalf("signer errors %v, want 0", got)
	}
	r.probes.Wait()
}

// TestReadinessRunHungSigner: a probe that never answers turns the gRPC
// health status NOT_SERVING once the window has passed, instead of
// stalling Run with the last status (SERVING) still published.
func TestReadinessRunHungSigner(t *testing.T) {
	ca := newTestCA(t, signer.ECDSAP256)
	ss := &slowSigner{Signer: ca.signer, started: make(chan struct{}, 1), release: make(chan struct{})}
	clk := newFakeClock()
	r := NewReadiness(ss, 200*time.Millisecond, clk.now, nil)
	r.Observe(nil)
	clk.add(time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { r.Run(ctx, 50*time.Millisecond); close(ran) }()
	defer func() { close(ss.release); cancel(); <-ran }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := r.health.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err == nil && resp.Status == healthpb.HealthCheckResponse_NOT_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gRPC health still %v with the signer hung", resp.GetStatus())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
