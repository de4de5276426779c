package server

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
)

// FrontDoorConfig configures a FrontDoor.
type FrontDoorConfig struct {
	// Listener is the SecurityService socket. Required.
	Listener net.Listener
	// Service answers the requests. Required.
	Service *Service
	// TLS is the server TLS configuration. Required.
	TLS *tls.Config
	// Limits bound connections; zero values take defaults.
	Limits ConnLimits
	// Register adds further services to each gRPC server (gRPC health).
	Register func(*grpc.Server)
	// ShutdownGrace bounds how long requests in flight may finish at
	// shutdown (default 10s).
	ShutdownGrace time.Duration
}

// stateHold is how long a front-door state must hold before the log
// reports it (set or cleared): a storm that fills the slots for moments
// is one line, not one per signature.
const stateHold = 5 * time.Second

// FrontDoor serves the SecurityService under ConnLimits. Its gRPC server
// can be replaced while the socket stays open: Drain sends GOAWAY on every
// open connection (by a graceful stop of the old server) while a new
// server takes the next connections, so a worker's retry reconnects —
// through a Kubernetes Service, to a healthy replica — instead of reusing
// a connection to this one.
type FrontDoor struct {
	cfg   FrontDoorConfig
	lis   *connListener
	guard *streamGuard
	state *stateLog

	mu       sync.Mutex
	current  *grpc.Server
	draining sync.WaitGroup
	serving  *errgroup.Group
	stopped  bool
}

// NewFrontDoor wraps cfg.Listener.
func NewFrontDoor(cfg FrontDoorConfig) *FrontDoor {
	cfg.Limits = cfg.Limits.withDefaults()
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = 10 * time.Second
	}
	svc := cfg.Service
	checkFileLimit(cfg.Limits.MaxConnections, svc.log)
	st := newStateLog(svc.log, 30*time.Second, stateHold)
	st.onChange = svc.metrics.frontState
	lis := newConnListener(cfg.Listener, cfg.Limits, svc.metrics, st)
	return &FrontDoor{
		cfg: cfg, lis: lis, state: st,
		guard: &streamGuard{lis: lis, svc: svc, timeout: cfg.Limits.FirstMessageTimeout, metrics: svc.metrics, state: st},
	}
}

// Addr is the socket's address.
func (f *FrontDoor) Addr() net.Addr { return f.lis.Addr() }

// Check reports why the front door cannot take workers now, or nil; a
// readiness check.
func (f *FrontDoor) Check() error { return f.lis.Check() }

// Run serves until ctx ends, then stops gracefully: requests in flight
// get ShutdownGrace to finish.
func (f *FrontDoor) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	f.mu.Lock()
	f.serving = g
	f.current = f.startLocked()
	f.mu.Unlock()
	g.Go(f.lis.Run)
	g.Go(func() error {
		every(gctx, time.Second, func() { f.lis.Sweep(); f.state.Sweep() })
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		f.shutdown()
		return nil
	})
	return g.Wait()
}

// startLocked starts a gRPC server on a new view of the listener.
func (f *FrontDoor) startLocked() *grpc.Server {
	opts := append(serverOptions(f.cfg.Service, f.cfg.TLS, f.cfg.Limits),
		grpc.InTapHandle(f.guard.tapHandle),
		grpc.StatsHandler(f.guard),
	)
	s := grpc.NewServer(opts...)
	securityapi.RegisterSecurityServiceServer(s, f.cfg.Service)
	if f.cfg.Register != nil {
		f.cfg.Register(s)
	}
	view := f.lis.View()
	f.serving.Go(func() error {
		if err := s.Serve(view); err != nil && !errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, errListenerClosed) {
			return err
		}
		return nil
	})
	return s
}

// Drain sends GOAWAY on every open connection; requests in flight finish,
// and new connections go to a fresh server.
func (f *FrontDoor) Drain() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped || f.current == nil {
		return
	}
	old := f.current
	f.current = f.startLocked()
	// Counted before the old server is stopped: once it sends GOAWAY its
	// connections may close before they are counted.
	f.cfg.Service.metrics.connsClosedN(closedNotReady, f.lis.open())
	f.draining.Add(1)
	go func() {
		defer f.draining.Done()
		f.stopWithin(old, f.cfg.ShutdownGrace)
	}()
}

func (f *FrontDoor) shutdown() {
	f.mu.Lock()
	f.stopped = true
	cur := f.current
	f.mu.Unlock()
	f.cfg.Service.log.Info("shutting down: finishing requests in flight", "grace", f.cfg.ShutdownGrace.String())
	f.stopWithin(cur, f.cfg.ShutdownGrace)
	f.draining.Wait()
	_ = f.lis.Close()
}

// stopWithin stops s gracefully (GOAWAY, requests in flight finish), and
// abruptly once grace has passed.
func (f *FrontDoor) stopWithin(s *grpc.Server, grace time.Duration) {
	done := make(chan struct{})
	go func() { s.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		f.cfg.Service.log.Warn("grace period over; closing remaining connections")
		s.Stop()
	}
}
