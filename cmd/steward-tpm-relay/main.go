// Command steward-tpm-relay lets several processes share one swtpm (which
// serves a single connection), like the kernel's /dev/tpmrm0 does for a
// chip, and can make it as slow as a discrete TPM for benchmarks:
//
//	steward-tpm-relay --upstream /run/swtpm/sock --listen /run/swtpm/relay.sock [--latency Sign=60ms ...]
//
// Clients (steward-trustd, steward-trustd-ceremony) use the --listen
// socket; tpm2-tools use --tcti-listen 127.0.0.1:PORT with
// TPM2TOOLS_TCTI=swtpm:host=127.0.0.1,port=PORT (its control channel is
// PORT+1). Every command runs whole, one at a time; each client sees and
// flushes only its own transient objects and sessions, which are flushed
// when it disconnects. Exit codes: 0 stopped by a signal, 1 failure, 2
// usage error.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-tpm/tpm2"
	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/tpmsim/relay"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	listen     string
	tctiListen string
	upstream   string
	latency    []string
	debug      bool
}

// run is main without the process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o options
	cmd := &cobra.Command{
		Use:   "steward-tpm-relay --upstream SWTPM-SOCKET --listen SOCKET [--latency COMMAND=DURATION ...]",
		Short: "Share one swtpm between processes, optionally as slow as a real TPM chip",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			return serve(ctx, o, stderr)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", "", "where clients connect: a unix socket path, or 127.0.0.1:PORT (required)")
	f.StringVar(&o.tctiListen, "tcti-listen", "", "also serve tpm2-tools' swtpm TCTI on this loopback address, 127.0.0.1:PORT (data) and PORT+1 (control channel); port 0 picks a free pair")
	f.StringVar(&o.upstream, "upstream", "", "swtpm's data socket (swtpm socket --server type=unixio,path=...), or HOST:PORT for --server type=tcp (required)")
	f.StringArrayVar(&o.latency, "latency", nil, "add device time to a TPM command, e.g. Sign=60ms (a discrete chip) or 0x15D=60ms; repeatable")
	f.BoolVar(&o.debug, "log-commands", false, "log every TPM command with its response code and time (debug level)")
	cli.Setup(cmd, version)
	return cli.Run(ctx, cmd, args, stdout, stderr)
}

func serve(ctx context.Context, o options, stderr io.Writer) error {
	latency, err := o.parse()
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if o.debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	r, err := relay.New(relay.Options{Upstream: dialer(o.upstream), Latency: latency, Log: log})
	if err != nil {
		return err
	}
	// tpm2-tools' ports first: a busy port fails before the socket that
	// scripts wait for appears.
	stopTCTI, err := serveTCTI(r, o.tctiListen, log)
	if err != nil {
		return err
	}
	ln, err := listen(o.listen)
	if err != nil {
		stopTCTI()
		return err
	}
	log.Info("steward-tpm-relay listening", "listen", ln.Addr().String(), "upstream", o.upstream, "latency", strings.Join(o.latency, ","))
	// Closing the listener is how Serve is told to return.
	go func() { <-ctx.Done(); _ = ln.Close(); stopTCTI() }()
	err = r.Serve(ln)
	return errors.Join(err, r.Close())
}

// serveTCTI serves --tcti-listen (if set): the relay on PORT and its
// control channel on PORT+1, as tpm2-tss's swtpm TCTI expects. It
// returns what stops both.
func serveTCTI(r *relay.Relay, addr string, log *slog.Logger) (func(), error) {
	if addr == "" {
		return func() {}, nil
	}
	data, ctrl, err := relay.ListenTCTI(addr)
	if errors.Is(err, relay.ErrNotLoopback) {
		return nil, cli.Usagef("--tcti-listen %s: %w", addr, err)
	}
	if err != nil {
		return nil, fmt.Errorf("--tcti-listen %s: %w", addr, err)
	}
	port := data.Addr().(*net.TCPAddr).Port
	log.Info("steward-tpm-relay serving tpm2-tools", "tcti", fmt.Sprintf("swtpm:host=127.0.0.1,port=%d", port), "control", ctrl.Addr().String())
	go func() {
		if err := r.ServeControl(ctrl); err != nil {
			log.Error("steward-tpm-relay: control channel stopped", "error", err)
		}
	}()
	go func() {
		if err := r.Serve(data); err != nil {
			log.Error("steward-tpm-relay: tpm2-tools listener stopped", "error", err)
		}
	}()
	// Closing the listeners is how both loops are told to return.
	return func() { _, _ = data.Close(), ctrl.Close() }, nil
}

func (o options) parse() (map[tpm2.TPMCC]time.Duration, error) {
	if o.listen == "" || o.upstream == "" {
		return nil, cli.Usagef("--listen and --upstream are required")
	}
	var latency map[tpm2.TPMCC]time.Duration
	for _, spec := range o.latency {
		var err error
		if latency, err = relay.ParseLatency(latency, spec); err != nil {
			return nil, cli.Usagef("--latency: %w", err)
		}
	}
	return latency, nil
}

// network tells a loopback TCP address from a unix socket path; TCP is
// refused on anything but loopback: a TPM must not be reachable from the
// network.
func network(addr string) (string, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return "unix", nil
	}
	if !ap.Addr().IsLoopback() {
		return "", cli.Usagef("%s: only loopback TCP addresses; use a unix socket otherwise", addr)
	}
	return "tcp", nil
}

func dialer(addr string) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		nw, err := network(addr)
		if err != nil {
			return nil, err
		}
		var d net.Dialer
		return d.DialContext(ctx, nw, addr)
	}
}

// listen opens the client socket, replacing a stale unix socket file that
// nothing accepts on (left by a killed relay).
func listen(addr string) (net.Listener, error) {
	nw, err := network(addr)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen(nw, addr)
	if err == nil || nw != "unix" || !errors.Is(err, syscall.EADDRINUSE) {
		return ln, err
	}
	if c, derr := net.Dial("unix", addr); derr == nil {
		_ = c.Close() // only probed whether someone answers
		return nil, fmt.Errorf("%s: another process serves this socket; stop it or choose another --listen", addr)
	}
	if err := os.Remove(addr); err != nil {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	return net.Listen(nw, addr)
}
