package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"time"

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

	creds, err := loadCredentials(cfg, sgn)
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
	})
	if err != nil {
		return err
	}

	holder := &server.CertHolder{}
	renew, err := setupServingCert(cfg, holder, sgn, svc, log)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.listen, err)
	}
	g := server.NewGRPCServer(svc, server.TLSConfig(holder.GetCertificate))
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if renew != nil {
		go renew.Run(runCtx, time.Minute)
	}
	errc := make(chan error, 1)
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

func loadCredentials(cfg *config, sgn signer.Signer) (*server.Credentials, error) {
	token := cfg.token
	if token == nil {
		b, err := readCertDirFile(cfg.certDir, "token", false)
		if err != nil {
			return nil, fmt.Errorf("worker token: set $TRUSTD_TOKEN or provide %s/token: %w", cfg.certDir, err)
		}
		token = b
	}
	caPEM := cfg.caPEM
	if caPEM == nil {
		b, err := readCertDirFile(cfg.certDir, "os-ca.crt", false)
		if err != nil {
			return nil, fmt.Errorf("OS CA certificate: set $TRUSTD_OS_CA_CRT or provide %s/os-ca.crt: %w", cfg.certDir, err)
		}
		caPEM = b
	}
	accepted, err := readCertDirFile(cfg.certDir, "accepted-cas.crt", true)
	if err != nil {
		return nil, fmt.Errorf("accepted CAs: %w", err)
	}
	return server.NewCredentials(token, caPEM, accepted, sgn.Public())
}

// setupServingCert installs the serving certificate: inline, from the
// cert dir, or self-issued through the signer. It returns the issuer to
// run for renewal when the certificate is self-issued.
func setupServingCert(cfg *config, holder *server.CertHolder, sgn signer.Signer, svc *server.Service, log *slog.Logger) (*server.SelfIssuer, error) {
	crt, key := cfg.srvCrt, cfg.srvKey
	if crt == nil {
		var err error
		if crt, err = readCertDirFile(cfg.certDir, "server.crt", true); err != nil {
			return nil, fmt.Errorf("serving certificate: %w", err)
		}
		if key, err = readCertDirFile(cfg.certDir, "server.key", true); err != nil {
			return nil, fmt.Errorf("serving key: %w", err)
		}
		if (crt == nil) != (key == nil) {
			return nil, errors.New("serving certificate: server.crt and server.key must both exist in the cert dir, or neither")
		}
	}
	if crt != nil {
		c, err := server.LoadKeyPair(crt, key, time.Now())
		if err != nil {
			return nil, err
		}
		if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: svc.Credentials().Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			log.Warn("serving certificate does not chain to the OS CA or accepted CAs; workers will refuse it", "error", err)
		}
		holder.Set(c)
		log.Info("serving certificate loaded", "dns", c.Leaf.DNSNames, "ips", c.Leaf.IPAddresses, "not_after", c.Leaf.NotAfter)
		return nil, nil
	}
	si := &server.SelfIssuer{
		Holder: holder,
		Signer: sgn,
		CA:     func() *x509.Certificate { return svc.Credentials().CA() },
		Hosts:  func() ([]string, error) { return servingHosts(cfg.certSANs) },
		Logger: log,
	}
	if err := si.Issue(); err != nil {
		return nil, err
	}
	return si, nil
}

// servingHosts lists every local interface address, the hostname and the
// extra SANs: workers dial whichever address the control-plane endpoint
// resolves to and check it against the IP SANs.
func servingHosts(extra []string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	add := func(h string) {
		if h != "" && !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list interface addresses: %w", err)
	}
	var ips []string
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() {
			ips = append(ips, n.IP.String())
		}
	}
	sort.Strings(ips)
	for _, e := range extra {
		add(e)
	}
	if h, err := os.Hostname(); err == nil {
		add(h)
	}
	for _, ip := range ips {
		add(ip)
	}
	return out, nil
}
