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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/authz"
	"github.com/steward-trustd/steward-trustd/internal/inventory"
)

// serveOptions are serve's flags.
type serveOptions struct {
	listen, tlsCert, tlsKey, clientCA, socketMode string
	sources                                       []string
	kubeconfig, namespace, selector, apiVersion   string
	state, healthAddr                             string
	extraCIDRs, dnsPatterns                       []string
	joinWindow, reloadInterval                    time.Duration
}

func serveCommand(stderr io.Writer) *cobra.Command {
	var o serveOptions
	c := &cobra.Command{
		Use:   "serve --listen unix:///PATH|HOST:PORT --source file:/PATH|nodes|machines ... --state FILE",
		Short: "Serve decisions from the inventory sources",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.serve(cmd.Context(), slog.New(slog.NewJSONHandler(stderr, nil)))
		},
	}
	f := c.Flags()
	f.StringVar(&o.listen, "listen", "", "unix:///path.sock (created mode --socket-mode) or host:port (mutual TLS: --tls-cert, --tls-key, --client-ca)")
	f.StringVar(&o.tlsCert, "tls-cert", "", "serving certificate (PEM) for a TCP --listen")
	f.StringVar(&o.tlsKey, "tls-key", "", "serving key (PEM) for a TCP --listen")
	f.StringVar(&o.clientCA, "client-ca", "", "CA certificates (PEM) a daemon's client certificate must chain to, for a TCP --listen")
	f.StringVar(&o.socketMode, "socket-mode", "0660", "mode of the unix socket (never writable by others)")
	cli.ListVar(f, &o.sources, "source", nil, "inventory source, repeatable: file:/path/inventory.json, nodes (Kubernetes Nodes), machines (Cluster API Machines)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig for the nodes and machines sources (default: in-cluster credentials)")
	f.StringVar(&o.namespace, "namespace", "", "namespace of the Machines (default: all namespaces)")
	f.StringVar(&o.selector, "selector", "", "label selector for Nodes and Machines, e.g. cluster.x-k8s.io/cluster-name=prod")
	f.StringVar(&o.apiVersion, "machine-api-version", "v1beta2", "Cluster API version the Machines are read as")
	f.StringVar(&o.state, "state", "", "state file of the pins and join records, on a persistent volume (required)")
	f.StringVar(&o.healthAddr, "health-addr", "", "plaintext address for GET /healthz only, e.g. 127.0.0.1:50011 (default: off)")
	cli.ListVar(f, &o.extraCIDRs, "extra-cidrs", nil, "comma-separated ranges any machine may have IP SANs in besides its own addresses and loopback, e.g. KubeSpan's fdcc::/16")
	cli.ListVar(f, &o.dnsPatterns, "dns-patterns", nil, "comma-separated extra DNS SANs: {name}.example.com, *.example.com")
	f.DurationVar(&o.joinWindow, "join-window", 0, "a machine may take its first certificate only this long after it appeared in the inventory (default: no window)")
	f.DurationVar(&o.reloadInterval, "reload-interval", 5*time.Second, "how often an inventory file is checked for changes")
	return c
}

func (o *serveOptions) rules() (authz.Rules, error) {
	prefixes, err := inventory.ParsePrefixes(o.extraCIDRs)
	if err != nil {
		return authz.Rules{}, cli.Usagef("--extra-cidrs: %v", err)
	}
	if err := inventory.CheckPatterns(o.dnsPatterns); err != nil {
		return authz.Rules{}, cli.Usagef("--dns-patterns: %v", err)
	}
	if o.joinWindow < 0 {
		return authz.Rules{}, cli.Usagef("--join-window must not be negative")
	}
	return authz.Rules{ExtraPrefixes: prefixes, DNSPatterns: o.dnsPatterns, JoinWindow: o.joinWindow}, nil
}

func (o *serveOptions) check() error {
	switch {
	case o.listen == "":
		return cli.Usagef("--listen is required (unix:///path.sock or host:port)")
	case len(o.sources) == 0:
		return cli.Usagef("--source is required (file:/path, nodes, machines)")
	case o.state == "":
		return cli.Usagef("--state is required: pins must survive a restart")
	}
	for _, s := range o.sources {
		if s != "nodes" && s != "machines" && !strings.HasPrefix(s, "file:/") {
			return cli.Usagef("--source %q: want file:/absolute/path, nodes or machines", s)
		}
	}
	return nil
}

func (o *serveOptions) serve(ctx context.Context, log *slog.Logger) error {
	if err := o.check(); err != nil {
		return err
	}
	rules, err := o.rules()
	if err != nil {
		return err
	}
	ln, err := o.listener()
	if err != nil {
		return err
	}
	defer func() { _ = ln.Close() }() // the server closed it already on the way out
	st, err := authz.OpenState(o.state)
	if err != nil {
		return err
	}
	engine := authz.NewEngine(rules, st, nil)
	if err := o.startSources(ctx, engine, rules, log); err != nil {
		return err
	}
	return serveHTTP(ctx, ln, authz.Handler(engine, log), o.healthAddr, log)
}

// startSources starts every source and returns once each delivered its
// first view (or failed).
func (o *serveOptions) startSources(ctx context.Context, e *authz.Engine, rules authz.Rules, log *slog.Logger) error {
	combined := inventory.NewCombined(e, rules, o.sources...)
	var kube *kubeSources
	for _, s := range o.sources {
		switch {
		case strings.HasPrefix(s, "file:"):
			src := &inventory.FileSource{Path: strings.TrimPrefix(s, "file:"), Interval: o.reloadInterval, Log: log}
			if err := src.Load(combined.UpdateFile(s)); err != nil {
				return err
			}
			go src.Run(ctx)
		default:
			if kube == nil {
				cfg, err := kubeConfig(o.kubeconfig)
				if err != nil {
					return err
				}
				kube = &kubeSources{cfg: cfg, selector: o.selector, namespace: o.namespace, version: o.apiVersion, combined: combined, log: log}
			}
			if err := kube.start(ctx, s); err != nil {
				return err
			}
		}
	}
	log.Info("inventory ready", "sources", o.sources, "machines", e.Snapshot().Len())
	return nil
}

func (k *kubeSources) start(ctx context.Context, source string) error {
	if source == "nodes" {
		return k.startNodes(ctx)
	}
	return k.startMachines(ctx)
}

// listener is the unix socket (a stale one replaced, the mode set before
// anyone can connect) or a TCP listener with mutual TLS.
func (o *serveOptions) listener() (net.Listener, error) {
	if path, ok := strings.CutPrefix(o.listen, "unix://"); ok {
		return unixListener(path, o.socketMode)
	}
	if o.tlsCert == "" || o.tlsKey == "" || o.clientCA == "" {
		return nil, cli.Usagef("a TCP --listen needs --tls-cert, --tls-key and --client-ca: decisions are served only to an authenticated daemon")
	}
	cfg, err := mtlsConfig(o.tlsCert, o.tlsKey, o.clientCA)
	if err != nil {
		return nil, err
	}
	ln, err := tls.Listen("tcp", o.listen, cfg)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", o.listen, err)
	}
	return ln, nil
}

func unixListener(path, modeText string) (net.Listener, error) {
	mode, err := strconv.ParseUint(modeText, 8, 32)
	if err != nil || mode&0o002 != 0 || mode > 0o777 {
		return nil, cli.Usagef("--socket-mode %q: want an octal mode not writable by others, e.g. 0660", modeText)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket: refusing to replace it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	old := syscall.Umask(0o777) // nobody can connect before the chmod
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := os.Chmod(path, os.FileMode(mode)); err != nil {
		return nil, errors.Join(fmt.Errorf("chmod %s: %w", path, err), ln.Close())
	}
	return ln, nil
}

func mtlsConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("client CA %s holds no PEM certificate", caFile)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}, nil
}

// serveHTTP serves h on ln (and /healthz on healthAddr) until ctx ends.
func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler, healthAddr string, log *slog.Logger) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 8 << 10}
	if healthAddr != "" {
		hs := &http.Server{Addr: healthAddr, Handler: healthOnly(h), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := hs.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
				log.Error("health endpoint", "addr", healthAddr, "error", err)
			}
		}()
		defer func() { _ = hs.Close() }() // on the way out; its errors are logged above
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("serving decisions", "listen", ln.Addr().String())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

func healthOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}
