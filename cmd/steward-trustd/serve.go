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
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/steward-trustd/steward-trustd/cmd/internal/backends"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/server"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/file"
)

// shutdownGrace bounds how long in-flight requests may finish after SIGTERM.
const shutdownGrace = 10 * time.Second

// serve runs the daemon until ctx ends. The signer is closed only after
// every goroutine that may use it has returned.
func serve(ctx context.Context, cfg *config, logOut io.Writer) error {
	log := newLogger(cfg, logOut)
	sgn, err := openSigner(ctx, cfg, log)
	if err != nil {
		return err
	}
	return serveWith(ctx, cfg, sgn, log)
}

// serveWith runs the daemon on an open signer and closes it once every
// part has stopped: requests in flight at shutdown still sign.
func serveWith(ctx context.Context, cfg *config, sgn signer.Signer, log *slog.Logger) error {
	d, err := newDaemon(cfg, sgn, log)
	if err == nil {
		err = d.run(ctx)
	}
	if cerr := sgn.Close(); cerr != nil {
		log.Error("close signer", "error", cerr)
	}
	return err
}

func newLogger(cfg *config, out io.Writer) *slog.Logger {
	level := slog.LevelInfo
	if cfg.debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewJSONHandler(out, &slog.HandlerOptions{Level: level}))
	if cfg.tenant != "" {
		log = log.With("tenant", cfg.tenant)
	}
	return log
}

// daemon is everything serve runs: the front door, the reloader, the
// self-issuer, readiness and the health server.
type daemon struct {
	cfg        *config
	log        *slog.Logger
	registry   *prometheus.Registry
	readiness  *server.Readiness
	front      *server.FrontDoor
	reloader   *server.Reloader
	selfIssuer *server.SelfIssuer
	authzFile  *server.FileDecider
	health     *http.Server
	healthLn   net.Listener
	issueLog   *issueLog
}

func newDaemon(cfg *config, sgn signer.Signer, log *slog.Logger) (*daemon, error) {
	desc := sgn.Describe()
	log.Info("signer opened", "backend", desc.Backend, "algorithm", desc.Algorithm, "fingerprint", desc.Fingerprint,
		"extractable", desc.Extractable, "policy", desc.Policy, "location", desc.Location)
	d := &daemon{cfg: cfg, log: log, registry: prometheus.NewRegistry()}
	d.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := server.NewMetrics(d.registry, desc.Backend, desc.Extractable)
	d.readiness = server.NewReadiness(sgn, cfg.readyWindow, nil, metrics)
	var err error
	if d.issueLog, err = openIssueLog(context.Background(), cfg, log, d.registry); err != nil {
		return nil, err
	}
	svc, holder, err := d.newService(sgn, metrics)
	if err == nil {
		err = d.listen(svc, holder)
	}
	if err != nil {
		return nil, errors.Join(err, d.issueLog.Close())
	}
	return d, nil
}

// newService loads the credentials and the serving certificate and builds
// the SecurityService and the reloader.
func (d *daemon) newService(sgn signer.Signer, metrics *server.Metrics) (*server.Service, *server.CertHolder, error) {
	cfg := d.cfg
	dir := server.CertDir{Dir: cfg.certDir, Token: cfg.token, CACert: cfg.caPEM, IssuerChain: cfg.issuer, IssuerFile: cfg.issuerFile, SignerPublic: sgn.Public(), RootPins: cfg.rootPins}
	creds, credsDigest, err := dir.Credentials()
	if err != nil {
		return nil, nil, err
	}
	server.LogIssuer(d.log, creds, time.Now())
	server.LogTrust(d.log, creds, metrics)
	server.LogTokenFile(d.log, creds)
	authorizer, authzFile, err := newAuthorizer(cfg, d.registry, d.log)
	if err != nil {
		return nil, nil, err
	}
	d.authzFile = authzFile
	if authorizer != nil {
		d.readiness.AddCheck(authorizer.Ready)
	}
	svc, err := server.New(server.Config{
		Signer:      sgn,
		Credentials: creds,
		Policy:      server.Policy{AllowedSANPrefixes: cfg.allowed, RequirePeerIP: cfg.peerIP},
		Logger:      d.log,
		Audit:       d.log.With("log", "audit"),
		Tenant:      cfg.tenant,
		RateLimits:  cfg.rates,
		Metrics:     metrics,
		Readiness:   d.readiness,
		IssueLog:    issueLogOf(d.issueLog),
		Authorizer:  authorizer,
	})
	if err != nil {
		return nil, nil, err
	}
	server.RegisterIssuerExpiry(d.registry, svc, nil)
	holder := &server.CertHolder{}
	var servingDigest server.Digest
	d.selfIssuer, servingDigest, err = setupServingCert(cfg, dir, holder, sgn, svc, metrics, d.log)
	if err != nil {
		return nil, nil, err
	}
	if d.selfIssuer != nil {
		d.readiness.Observe(nil) // that was a real signature: no readiness probe needed on a slow TPM
	}
	d.reloader = &server.Reloader{Dir: dir, Service: svc, Metrics: metrics, Logger: d.log, ForceTokenReplace: cfg.tokenForce}
	if d.selfIssuer == nil && cfg.srvCrt == nil {
		d.reloader.Holder = holder
	}
	d.reloader.Prime(credsDigest, servingDigest)
	return svc, holder, nil
}

// listen opens the SecurityService socket behind the front door and the
// health socket; readiness learns about the front door both ways.
func (d *daemon) listen(svc *server.Service, holder *server.CertHolder) error {
	ln, err := net.Listen("tcp", d.cfg.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", d.cfg.listen, err)
	}
	d.front = server.NewFrontDoor(server.FrontDoorConfig{
		Listener:      ln,
		Service:       svc,
		TLS:           server.TLSConfig(holder.GetCertificate),
		Limits:        d.cfg.conns,
		Register:      d.readiness.RegisterHealth,
		ShutdownGrace: shutdownGrace,
	})
	d.readiness.AddCheck(d.front.Check)
	if d.issueLog != nil {
		d.readiness.AddCheck(logReady(d.issueLog))
	}
	d.readiness.OnSignerNotReady(d.front.Drain, d.log)
	if d.cfg.healthAddr == "" {
		return nil
	}
	d.health = server.NewHealthServer(d.cfg.healthAddr, withLogHandler(d.issueLog, server.HealthHandler(d.readiness, d.registry)))
	if d.healthLn, err = net.Listen("tcp", d.cfg.healthAddr); err != nil {
		err = errors.Join(err, ln.Close())
		return fmt.Errorf("listen on health address %s: %w", d.cfg.healthAddr, err)
	}
	return nil
}

// run serves until ctx ends or one part fails; every part stops before
// run returns.
func (d *daemon) run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return d.front.Run(gctx) })
	g.Go(func() error { d.reloader.Run(gctx, d.cfg.reloadInterval); return nil })
	g.Go(func() error { d.readiness.Run(gctx, d.cfg.readyWindow/3); return nil })
	if d.authzFile != nil {
		g.Go(func() error { d.authzFile.Run(gctx); return nil })
	}
	if d.selfIssuer != nil {
		g.Go(func() error { d.selfIssuer.Run(gctx, time.Minute); return nil })
	}
	if d.health != nil {
		g.Go(func() error { return serveHealth(gctx, d.health, d.healthLn) })
		d.log.Info("health and metrics listening", "address", d.healthLn.Addr().String())
	}
	d.log.Info("steward-trustd listening", "address", d.front.Addr().String(), "version", version, "issuance_log", d.cfg.logDescription())
	err := g.Wait()
	if d.issueLog != nil {
		err = errors.Join(err, d.issueLog.Close())
	}
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// serveHealth serves the health address until ctx ends.
func serveHealth(ctx context.Context, srv *http.Server, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	defer stop()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("health server: %w", err)
	}
	return nil
}

func openSigner(ctx context.Context, cfg *config, log *slog.Logger) (signer.Signer, error) {
	ctx = signer.WithKeyRole(ctx, cfg.signerRole())
	if cfg.inlineCA != nil {
		return (&file.Backend{Logger: log}).FromPEM(ctx, cfg.inlineCA, "$TRUSTD_OS_CA_KEY")
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
		if _, err := c.Leaf.Verify(servedChainOptions(c, svc.Credentials().Pool())); err != nil {
			log.Warn("serving certificate does not chain to the OS CA or accepted CAs; workers will refuse it", "error", err)
		}
		warnMissingSANs(c.Leaf, cfg.certSANs, log)
		holder.Set(c)
		m.SetServingExpiry(c.Leaf.NotAfter, time.Now())
		log.Info("serving certificate loaded", "dns", c.Leaf.DNSNames, "ips", c.Leaf.IPAddresses, "not_after", c.Leaf.NotAfter)
		return nil, d, nil
	}
	si := &server.SelfIssuer{
		Holder:      holder,
		Signer:      sgn,
		Credentials: svc.Credentials,
		Hosts:       func() ([]string, error) { return servingHosts(cfg.certSANs, log) },
		Logger:      log,
		Metrics:     m,
		IssueLog:    svc.IssueLog(),
	}
	if err := si.Issue(); err != nil {
		return nil, d, err
	}
	return si, d, nil
}

// servedChainOptions verifies a serving certificate as a worker does:
// to the bundle, through the intermediates served with it.
func servedChainOptions(c *tls.Certificate, roots *x509.CertPool) x509.VerifyOptions {
	opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, der := range c.Certificate[1:] {
		if ic, err := x509.ParseCertificate(der); err == nil {
			opts.Intermediates.AddCert(ic)
		}
	}
	return opts
}

// signerRole is the signing key's role: a tiered node's intermediate when
// an issuer chain is configured or present in the cert dir, else the OS
// CA. Messages about the key (a file key's warning) name it.
func (c *config) signerRole() signer.KeyRole {
	if c.issuer != nil || c.issuerFile != "" {
		return signer.RoleIntermediate
	}
	if _, err := os.Stat(filepath.Join(c.certDir, certdir.FileIssuerChain)); err == nil {
		return signer.RoleIntermediate
	}
	return signer.RoleOSCA
}
