package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/steward-trustd/steward-trustd/internal/authz"
)

// AuthorizerMode says what a refusal of the authorizer does.
type AuthorizerMode string

const (
	// AuthorizerEnforce refuses what the authorizer refuses, and answers
	// Unavailable when it cannot be asked: never a silent allow.
	AuthorizerEnforce AuthorizerMode = "enforce"
	// AuthorizerObserve issues anyway and logs and counts "would_deny":
	// for a safe rollout.
	AuthorizerObserve AuthorizerMode = "observe"
)

// ParseAuthorizerMode reads TRUSTD_AUTHORIZER_MODE.
func ParseAuthorizerMode(s string) (AuthorizerMode, error) {
	switch m := AuthorizerMode(s); m {
	case AuthorizerEnforce, AuthorizerObserve:
		return m, nil
	case "":
		return AuthorizerEnforce, nil
	}
	return "", fmt.Errorf("authorizer mode %q: want enforce or observe", s)
}

// Decider answers decision requests: the built-in file inventory or a
// webhook.
type Decider interface {
	Decide(ctx context.Context, req *authz.Request) (*authz.Response, error)
	// Describe names it for logs ("file:/…", "https://…", "unix:///…").
	Describe() string
}

// AuthorizerConfig configures an Authorizer.
type AuthorizerConfig struct {
	Decider Decider
	Mode    AuthorizerMode
	// Timeout bounds one decision (default 2 s).
	Timeout time.Duration
	// MaxConcurrent bounds decisions in flight (default 64); a request
	// beyond waits for a slot until its deadline.
	MaxConcurrent int
	// CacheTTL is how long an allow for the same peer and SANs is reused
	// (default 10 s; negative: no cache). Refusals are never cached.
	CacheTTL time.Duration
	// CacheSize bounds the cached allows (default 4096).
	CacheSize int
	Log       *slog.Logger
	Metrics   *AuthorizerMetrics
	Now       func() time.Time
}

// Authorizer asks a Decider about each request that passed the token,
// CSR and static policy checks.
type Authorizer struct {
	cfg   AuthorizerConfig
	slots chan struct{}
	cache allowCache

	mu        sync.Mutex
	failing   string // "" while the last decision worked
	probing   bool
	lastProbe time.Time
}

// NewAuthorizer checks cfg and fills in defaults.
func NewAuthorizer(cfg AuthorizerConfig) (*Authorizer, error) {
	if cfg.Decider == nil {
		return nil, errors.New("authorizer: no decider")
	}
	if _, err := ParseAuthorizerMode(string(cfg.Mode)); err != nil {
		return nil, err
	}
	if cfg.Mode == "" {
		cfg.Mode = AuthorizerEnforce
	}
	cfg = cfg.withDefaults()
	return &Authorizer{cfg: cfg, slots: make(chan struct{}, cfg.MaxConcurrent), cache: allowCache{ttl: cfg.CacheTTL, max: cfg.CacheSize, entries: map[string]time.Time{}}}, nil
}

func (c AuthorizerConfig) withDefaults() AuthorizerConfig {
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Second
	}
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = 64
	}
	if c.CacheTTL == 0 {
		c.CacheTTL = 10 * time.Second
	}
	if c.CacheSize <= 0 {
		c.CacheSize = 4096
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Mode returns the configured mode.
func (a *Authorizer) Mode() AuthorizerMode { return a.cfg.Mode }

// Ready is a readiness check: in enforce mode, an authorizer whose last
// decision failed makes the daemon not ready (it could issue nothing).
// A not-ready daemon gets no requests that would show the authorizer is
// back, so while failing it probes (at most once a second, in the
// background) with a request no inventory holds: any valid answer means
// reachable.
func (a *Authorizer) Ready() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.failing == "" || a.cfg.Mode != AuthorizerEnforce {
		return nil
	}
	if now := a.cfg.Now(); !a.probing && now.Sub(a.lastProbe) >= time.Second {
		a.probing, a.lastProbe = true, now
		go a.probe()
	}
	return fmt.Errorf("authorizer %s unreachable: %s", a.cfg.Decider.Describe(), a.failing)
}

// ProbePeer is the peer of readiness probes: TEST-NET-1 (RFC 5737), an
// address no machine owns.
const ProbePeer = "192.0.2.0"

func (a *Authorizer) probe() {
	defer func() { a.mu.Lock(); a.probing = false; a.mu.Unlock() }()
	req := &authz.Request{APIVersion: authz.APIVersion, Peer: ProbePeer, Subject: "readiness probe", DNSNames: []string{}, IPAddresses: []string{}, TokenIndex: -1}
	_, _ = a.decide(context.Background(), req)
}

// authzRecord is what the audit line says about the decision.
type authzRecord struct {
	outcome string // authz outcome, "would_deny", "error" or "cached"
	reason  string
	machine string
}

// authzDeniedError is the authorizer's refusal: PermissionDenied.
type authzDeniedError struct{ outcome, reason string }

func (e *authzDeniedError) Error() string { return e.reason }

// authzUnavailableError is an authorizer that could not decide, in
// enforce mode: Unavailable (workers retry).
type authzUnavailableError struct{ err error }

func (e *authzUnavailableError) Error() string { return "authorizer: " + e.err.Error() }
func (e *authzUnavailableError) Unwrap() error { return e.err }

// check asks the decider about r and returns an error when the request
// must be refused; rec records the decision for the audit line.
func (a *Authorizer) check(ctx context.Context, r *Request, peer netip.Addr, tokenIndex int, tenant string, rec *authzRecord) error {
	key := cacheKey(peer, r.Requested)
	now := a.cfg.Now()
	if a.cache.hit(key, now) {
		rec.outcome, rec.reason = authz.OutcomeAllowed, "cached allow"
		a.cfg.Metrics.decision("cached")
		return nil
	}
	resp, err := a.decide(ctx, decisionRequest(r, peer, tokenIndex, tenant))
	if err != nil {
		return a.failed(err, rec)
	}
	a.cfg.Metrics.decision(resp.Outcome)
	rec.machine = resp.Machine
	if resp.Allow {
		rec.outcome, rec.reason = resp.Outcome, resp.Reason
		a.cache.add(key, now)
		return nil
	}
	if a.cfg.Mode == AuthorizerObserve {
		rec.outcome, rec.reason = authz.OutcomeWouldDeny, resp.Outcome+": "+resp.Reason
		return nil
	}
	rec.outcome, rec.reason = resp.Outcome, resp.Reason
	return &authzDeniedError{outcome: resp.Outcome, reason: "not authorized for this machine: " + resp.Reason}
}

// failed handles a decision that could not be made: never an allow in
// enforce mode; observe mode issues and records the error.
func (a *Authorizer) failed(err error, rec *authzRecord) error {
	a.cfg.Metrics.decision("error")
	rec.outcome, rec.reason = "error", err.Error()
	if a.cfg.Mode == AuthorizerObserve {
		return nil
	}
	return &authzUnavailableError{err: err}
}

// decide takes a slot and asks the decider within the timeout.
func (a *Authorizer) decide(ctx context.Context, req *authz.Request) (*authz.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	select {
	case a.slots <- struct{}{}:
	case <-ctx.Done():
		a.cfg.Metrics.failure("busy")
		return nil, fmt.Errorf("%d decisions already in flight and none finished in time", a.cfg.MaxConcurrent)
	}
	defer func() { <-a.slots }()
	start := a.cfg.Now()
	resp, err := a.cfg.Decider.Decide(ctx, req)
	a.cfg.Metrics.latency(a.cfg.Now().Sub(start))
	a.observe(err)
	if err != nil {
		a.cfg.Metrics.failure(failureKind(err))
		return nil, err
	}
	return resp, nil
}

// observe logs the decider's state once per change.
func (a *Authorizer) observe(err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	a.mu.Lock()
	was := a.failing
	a.failing = msg
	a.mu.Unlock()
	a.cfg.Metrics.setUp(err == nil)
	switch {
	case err != nil && was == "":
		a.cfg.Log.Error("authorizer failing; requests get Unavailable in enforce mode until it answers", "authorizer", a.cfg.Decider.Describe(), "mode", a.cfg.Mode, "error", err)
	case err == nil && was != "":
		a.cfg.Log.Info("authorizer recovered", "authorizer", a.cfg.Decider.Describe(), "previous_error", was)
	}
}

func failureKind(err error) string {
	var bad *badResponseError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.As(err, &bad):
		return "bad_response"
	default:
		return "unreachable"
	}
}

func decisionRequest(r *Request, peer netip.Addr, tokenIndex int, tenant string) *authz.Request {
	req := &authz.Request{
		APIVersion: authz.APIVersion, Peer: peer.Unmap().String(), Subject: r.Subject.String(),
		DNSNames: r.DNSNames, IPAddresses: make([]string, 0, len(r.IPs)),
		CSRSHA256: r.SHA256, KeyType: r.KeyType, TokenIndex: tokenIndex, Tenant: tenant,
	}
	if req.DNSNames == nil {
		req.DNSNames = []string{}
	}
	for _, ip := range r.IPs {
		a, _ := netip.AddrFromSlice(ip)
		req.IPAddresses = append(req.IPAddresses, a.Unmap().String())
	}
	return req
}

func cacheKey(peer netip.Addr, sans []string) string {
	return peer.Unmap().String() + "|" + strings.Join(sans, ",")
}

// allowCache remembers allows for a short time: a worker retrying, or
// a burst of identical requests, does not ask again.
type allowCache struct {
	ttl     time.Duration
	max     int
	mu      sync.Mutex
	entries map[string]time.Time // key -> expiry
}

func (c *allowCache) hit(key string, now time.Time) bool {
	if c.ttl < 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	exp, ok := c.entries[key]
	return ok && now.Before(exp)
}

func (c *allowCache) add(key string, now time.Time) {
	if c.ttl < 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		for k, exp := range c.entries {
			if !now.Before(exp) {
				delete(c.entries, k)
			}
		}
	}
	if len(c.entries) >= c.max {
		clear(c.entries) // all live: start over rather than grow
	}
	c.entries[key] = now.Add(c.ttl)
}

// authorize is the handler's hook: nothing without an authorizer.
func (s *Service) authorize(ctx context.Context, creds *Credentials, r *Request, peer netip.Addr, fingerprint string, rec *authzRecord) error {
	if s.authorizer == nil {
		return nil
	}
	return s.authorizer.check(ctx, r, peer, tokenIndex(creds, fingerprint), s.tenant, rec)
}

// tokenIndex finds which of the valid tokens has fingerprint.
func tokenIndex(creds *Credentials, fingerprint string) int {
	for i, fp := range creds.tokens.fingerprints() {
		if fp == fingerprint {
			return i
		}
	}
	return -1
}

// appendAttrs adds the decision to an audit line.
func (r authzRecord) appendAttrs(attrs []slog.Attr) []slog.Attr {
	if r.outcome == "" {
		return attrs
	}
	attrs = append(attrs, slog.String("authorizer", r.outcome), slog.String("authorizer_reason", r.reason))
	if r.machine != "" {
		attrs = append(attrs, slog.String("machine", r.machine))
	}
	return attrs
}

// classifyAuthz is classify's part for the authorizer's errors. The
// client learns the outcome, not the reason: the reason names other
// machines of the inventory, which a token holder must not learn.
func classifyAuthz(err error) (class, bool) {
	var (
		denied *authzDeniedError
		unav   *authzUnavailableError
	)
	switch {
	case errors.As(err, &denied):
		return class{codes.PermissionDenied, authz.ClientDeniedPrefix + " (" + denied.outcome + "); the trustd audit log says why", denied.outcome}, true
	case errors.As(err, &unav):
		return class{codes.Unavailable, authz.ClientUnavailable, "authorizer_unavailable"}, true
	}
	return class{}, false
}

// otherDenial is the trustd_requests_denied_total reason of an outcome
// observeOutcome does not name itself.
func otherDenial(o string) string {
	if authz.KnownDenial(o) {
		return "authorizer"
	}
	return "other"
}
