package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-trustd/steward-trustd/cmd/internal/backends"
	"github.com/steward-trustd/steward-trustd/internal/issuelog"
	"github.com/steward-trustd/steward-trustd/server"
	"github.com/steward-trustd/steward-trustd/signer"
)

// openIssueLog opens the log key and the log when TRUSTD_LOG=required.
// The key must be the one log.pub pins: a daemon started with another
// key would sign checkpoints no owner trusts. Every failure stops the
// start, with one line saying what to do.
func openIssueLog(ctx context.Context, cfg *config, log *slog.Logger, reg prometheus.Registerer) (*issueLog, error) {
	if cfg.logMode != logRequired {
		return nil, nil
	}
	pinned, err := os.ReadFile(filepath.Join(cfg.logDir, issuelog.FileVerifier))
	if err != nil {
		return nil, fmt.Errorf("issuance log: %w: create the log key with steward-trustd-ceremony log init --signer URI --log %s, or set TRUSTD_LOG=off", err, cfg.logDir)
	}
	vkey := strings.TrimSpace(string(pinned))
	name, _, _ := strings.Cut(vkey, "+")
	bk, err := backends.Registry(log)
	if err != nil {
		return nil, err
	}
	key, err := bk.Open(signer.WithKeyRole(ctx, signer.RoleIssuanceLog), cfg.logKey)
	if err != nil {
		return nil, fmt.Errorf("open log key (TRUSTD_LOG_KEY): %w", err)
	}
	l, err := openWithKey(cfg, log, reg, key, name, vkey)
	if err != nil {
		return nil, errors.Join(err, key.Close())
	}
	return &issueLog{Log: l, key: key}, nil
}

// issueLog is the open log and its key, closed together.
type issueLog struct {
	*issuelog.Log
	key signer.Signer
}

// Close signs the last checkpoint, then closes the key.
func (l *issueLog) Close() error {
	if l == nil {
		return nil
	}
	return errors.Join(l.Log.Close(), l.key.Close())
}

func openWithKey(cfg *config, log *slog.Logger, reg prometheus.Registerer, key signer.Signer, name, vkey string) (*issuelog.Log, error) {
	ns, err := issuelog.NewNoteSigner(name, key)
	if err != nil {
		return nil, err
	}
	if ns.Verifier() != vkey {
		return nil, fmt.Errorf("issuance log: TRUSTD_LOG_KEY is not the key %s pins (%s): use the key log init created, or run log init again", issuelog.FileVerifier, vkey)
	}
	healthy := prometheus.NewGauge(prometheus.GaugeOpts{Name: "trustd_issuance_log_healthy", Help: "1 while the issuance log appends, 0 while it fails (certificates are withheld)."})
	reg.MustRegister(healthy)
	healthy.Set(1)
	return issuelog.Open(cfg.logDir, issuelog.Options{Signer: ns, Interval: cfg.logInterval, Logger: log, OnHealth: func(err error) {
		healthy.Set(map[bool]float64{true: 1, false: 0}[err == nil])
	}})
}

// issueLogOf is l as the service's IssueLog; nil stays an untyped nil.
func issueLogOf(l *issueLog) server.IssueLog {
	if l == nil {
		return nil
	}
	return l
}

// withLogHandler serves the log read-only under /log/ next to health.
func withLogHandler(l *issueLog, health http.Handler) http.Handler {
	if l == nil {
		return health
	}
	mux := http.NewServeMux()
	mux.Handle("/log/", l.Handler("/log/"))
	mux.Handle("/", health)
	return mux
}

// logReady is the readiness check of the log.
func logReady(l *issueLog) func() error {
	return func() error {
		if err := l.Healthy(); err != nil {
			return fmt.Errorf("issuance log cannot append: %w", err)
		}
		return nil
	}
}
