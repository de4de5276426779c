package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/net/netutil"

	"github.com/steward-trustd/steward-trustd/cmd/internal/backends"
	"github.com/steward-trustd/steward-trustd/server"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/file"
)

// shutdownGrace bounds how long in-flight requests may finish after SIGTERM.
const shutdownGrace = 10 * time.Second

func serve(ctx context.Context, cfg *config, logOut io.Writer) error {
	level := slog.LevelInfo
	if cfg.debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewJSONHandler(logOut, &slog.HandlerOptions{Level: level}))
	if cfg.tenant != "" {
		log = log.With("tenant", cfg.tenant)
	}

	sgn, err := openSigner(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer func() {
		if err := sgn.Close(); err != nil {
			log.Error("close signer", "error", err)
		}
	}()
	d := sgn.Describe()
	log.Info("signer opened", "backend", d.Backend, "algorithm", d.Algorithm, "fingerprint", d.Fingerprint,
		"extractable", d.Extractable, "policy", d.Policy, "location", d.Location)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := server.NewMetrics(reg, d.Backend, d.Extractable)
	readiness := server.NewReadiness(sgn, cfg.readyWindow, nil, metrics)

	dir := server.CertDir{Dir: cfg.certDir, Token: cfg.token, CACert: cfg.caPEM, SignerPublic: sgn.Public()}
	creds, credsDigest, err := dir.Credentials()
	if err != nil {
		return err
	}
	svc, err := server.New(server.Config{
		Signer:      sgn,
		Credentials: creds,
		Policy:      server.Policy{AllowedSANPrefixes: cfg.allowed, RequirePeerIP: cfg.peerIP},
		Logger:      log,
		Audit:       log.With("log", "audit"),
		Tenant:      cfg.tenant,
		RateLimits:  cfg.rates,
		Metrics:     metrics,
		Readiness:   readiness,
	})
	if err != nil {
		return err
	}

	holder := &server.CertHolder{}
	selfIssuer, servingDigest, err := setupServingCert(cfg, dir, holder, sgn, svc, metrics, log)
	if err != nil {
		return err
	}
	reloader := &server.Reloader{Dir: dir, Service: svc, Metrics: metrics, Logger: log}
	if selfIssuer == nil && cfg.srvCrt == nil {
		reloader.Holder = holder
	}
	reloader.Prime(credsDigest, servingDigest)

	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.listen, err)
	}
	// Bound open connections (each costs buffers and a TLS handshake) so a
	// fleet power-up cannot grow memory without limit; the rest wait in the
	// kernel's accept queue and workers retry.
	ln = netutil.LimitListener(ln, cfg.maxConns)
	g := server.NewGRPCServer(svc, server.TLSConfig(holder.GetCertificate))
	readiness.RegisterHealth(g)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if selfIssuer != nil {
		go selfIssuer.Run(runCtx, time.Minute)
	}
	go reloader.Run(runCtx, cfg.reloadInterval)
	go readiness.Run(runCtx, cfg.readyWindow/3)

	var health *http.Server
	errc := make(chan error, 2)
	if cfg.healthAddr != "" {
		health = server.NewHealthServer(cfg.healthAddr, server.HealthHandler(readiness, reg))
		hln, err := net.Listen("tcp", cfg.healthAddr)
		if err != nil {
			return fmt.Errorf("listen on health address %s: %w", cfg.healthAddr, err)
		}
		go func() {
			if err := health.Serve(hln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("health server: %w", err)
			}
		}()
		log.Info("health and metrics listening", "address", hln.Addr().String())
	}
	go func() { errc <- g.Serve(ln) }()
	log.Info("steward-trustd listening", "address", ln.Addr().String(), "version", version)

	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down: finishing requests in flight")
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(shutdownGrace):
		log.Warn("grace period over; closing remaining connections")
		g.Stop()
	}
	if health != nil {
		sctx, scancel := context.WithTimeout(context.Background(), time.Second)
		defer scancel()
		_ = health.Shutdown(sctx)
	}
	return nil
}

func openSigner(ctx context.Context, cfg *config, log *slog.Logger) (signer.Signer, error) {
	if cfg.inlineCA != nil {
		return (&file.Backend{Logger: log}).FromPEM(cfg.inlineCA, "$TRUSTD_OS_CA_KEY")
	}
	reg, err := backends.Registry(log)
	if err != nil {
		return nil, err
	}
	s, err := reg.Open(ctx, cfg.signer)
	if err != nil {
		// No fallback to any other key, ever: a configured device that
		// fails stops the daemon.
		return nil, fmt.Errorf("open signer (--signer / $TRUSTD_SIGNER): %w", err)
	}
	return s, nil
}

// setupServingCert installs the serving certificate: inline, from the
// cert dir, or self-issued through the signer. It returns the issuer to
// run for renewal when the certificate is self-issued, and the digest of
// the cert dir's serving files.
func setupServingCert(cfg *config, dir server.CertDir, holder *server.CertHolder, sgn signer.Signer, svc *server.Service, m *server.Metrics, log *slog.Logger) (*server.SelfIssuer, server.Digest, error) {
	var c *tls.Certificate
	var d server.Digest
	var err error
	if cfg.srvCrt != nil {
		c, err = server.LoadKeyPair(cfg.srvCrt, cfg.srvKey, time.Now())
	} else {
		c, d, err = dir.ServingCert(time.Now())
	}
	if err != nil {
		return nil, d, err
	}
	if c != nil {
		if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: svc.Credentials().Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			log.Warn("serving certificate does not chain to the OS CA or accepted CAs; workers will refuse it", "error", err)
		}
		holder.Set(c)
		m.SetServingExpiry(c.Leaf.NotAfter, time.Now())
		log.Info("serving certificate loaded", "dns", c.Leaf.DNSNames, "ips", c.Leaf.IPAddresses, "not_after", c.Leaf.NotAfter)
		return nil, d, nil
	}
	si := &server.SelfIssuer{
		Holder:  holder,
		Signer:  sgn,
		CA:      func() *x509.Certificate { return svc.Credentials().CA() },
		Hosts:   func() ([]string, error) { return servingHosts(cfg.certSANs) },
		Logger:  log,
		Metrics: m,
	}
	if err := si.Issue(); err != nil {
		return nil, d, err
	}
	return si, d, nil
}
