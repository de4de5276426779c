package main

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-trustd/steward-trustd/server"
)

// authorizerConfig are the settings of per-machine join authorization.
type authorizerConfig struct {
	target        server.AuthorizerTarget
	mode          server.AuthorizerMode
	state         string
	timeout       time.Duration
	cacheTTL      time.Duration
	maxConcurrent int
	webhook       server.WebhookTLS
}

func (c *config) authorizerSettings() []setting {
	a := &c.authz
	return []setting{
		{flag: "authorizer", env: "TRUSTD_AUTHORIZER", def: "none", doc: "who decides per machine after the token and CSR checks: none, file:/path/inventory.json (built in, hot-reloaded), https://… or unix:///….sock (a webhook speaking docs/authorizer-protocol.md)", to: bind("authorizer", &a.target, server.ParseAuthorizerTarget)},
		{flag: "authorizer-mode", env: "TRUSTD_AUTHORIZER_MODE", def: "enforce", doc: "enforce: refused is refused and an authorizer that cannot answer means Unavailable; observe: issue anyway, audit authorizer=would_deny (for a rollout)", to: bind("mode", &a.mode, server.ParseAuthorizerMode)},
		{flag: "authorizer-state", env: "TRUSTD_AUTHORIZER_STATE", derived: "required with file:", doc: "state file of the built-in authorizer's pins, on a persistent writable volume", to: text(&a.state)},
		{flag: "authorizer-timeout", env: "TRUSTD_AUTHORIZER_TIMEOUT", def: "2s", doc: "bound on one decision", to: duration(&a.timeout)},
		{flag: "authorizer-cache-ttl", env: "TRUSTD_AUTHORIZER_CACHE_TTL", def: "10s", doc: "an allow for the same peer and SANs is reused this long; 0s disables (refusals are never cached)", to: bind("duration", &a.cacheTTL, cacheTTL)},
		{flag: "authorizer-max-concurrent", env: "TRUSTD_AUTHORIZER_MAX_CONCURRENT", def: "64", doc: "decisions in flight at once; more wait until their deadline", to: posInt(&a.maxConcurrent)},
		{flag: "authorizer-ca", env: "TRUSTD_AUTHORIZER_CA", derived: "system roots", doc: "PEM CA certificates an https authorizer's certificate must chain to", to: text(&a.webhook.CAFile)},
		{flag: "authorizer-client-cert", env: "TRUSTD_AUTHORIZER_CLIENT_CERT", doc: "PEM client certificate for an https authorizer (with TRUSTD_AUTHORIZER_CLIENT_KEY)", to: text(&a.webhook.CertFile)},
		{flag: "authorizer-client-key", env: "TRUSTD_AUTHORIZER_CLIENT_KEY", doc: "PEM key of that client certificate", to: text(&a.webhook.KeyFile)},
		{flag: "authorizer-socket-uid", env: "TRUSTD_AUTHORIZER_SOCKET_UID", derived: "root or the daemon's own uid", doc: "uid a unix-socket authorizer may run as besides root and the daemon's user (its socket must not be writable by others)", to: bind("int", &a.webhook.SocketUID, intIn(0, 1<<31-1))},
	}
}

// cacheTTL reads the cache lifetime; 0 (or 0s) turns the cache off.
func cacheTTL(v string) (time.Duration, error) {
	if d, err := time.ParseDuration(v); err == nil && d == 0 {
		return -1, nil
	}
	return asDuration(v)
}

// checkAuthorizer refuses settings that cannot work together.
func checkAuthorizer(c *config) error {
	a := &c.authz
	switch {
	case a.target.Kind == "file" && a.state == "":
		return c.bad("authorizer-state", "the built-in file authorizer keeps its pins in a state file: set TRUSTD_AUTHORIZER_STATE to a path on a persistent writable volume")
	case a.target.Kind != "file" && a.state != "":
		return c.bad("authorizer-state", "only the built-in file authorizer keeps a state file; a webhook keeps its own")
	case (a.webhook.CertFile == "") != (a.webhook.KeyFile == ""):
		return c.bad("authorizer-client-key", "the client certificate and key must be given together (TRUSTD_AUTHORIZER_CLIENT_CERT and TRUSTD_AUTHORIZER_CLIENT_KEY)")
	}
	return nil
}

// newAuthorizer builds the configured authorizer, nil for none; run, if
// not nil, keeps a file inventory reloaded.
func newAuthorizer(cfg *config, reg prometheus.Registerer, log *slog.Logger) (*server.Authorizer, *server.FileDecider, error) {
	a := &cfg.authz
	var (
		d    server.Decider
		file *server.FileDecider
		err  error
	)
	switch a.target.Kind {
	case "none", "":
		return nil, nil, nil
	case "file":
		file, err = server.NewFileDecider(a.target.Path, a.state, log, nil)
		d = file
	default:
		d, err = server.NewWebhook(a.target.Path, a.webhook)
	}
	if err != nil {
		return nil, nil, err
	}
	az, err := server.NewAuthorizer(server.AuthorizerConfig{Decider: d, Mode: a.mode, Timeout: a.timeout, MaxConcurrent: a.maxConcurrent,
		CacheTTL: a.cacheTTL, Log: log, Metrics: server.NewAuthorizerMetrics(reg)})
	if err != nil {
		return nil, nil, err
	}
	log.Info("authorizer configured", "authorizer", d.Describe(), "mode", a.mode)
	return az, file, nil
}
