package server

import (
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLimits bound load per caller and on the signer. Zero values take the
// defaults documented on each field; a negative rate disables that limit,
// and a burst of zero or less takes the default.
type RateLimits struct {
	// PerPeerRate is the sustained requests per second from one address
	// (default 1: a worker asks once per 12 h, and ~7 times a minute while
	// retrying).
	PerPeerRate float64
	// PerPeerBurst is the burst from one address (default 20).
	PerPeerBurst int
	// BadTokenRate is how fast an address that sent a wrong token earns
	// another try, per second (default 0.1: one every 10 s; negative: no
	// limit). Only wrong tokens are slowed down, never a valid one.
	BadTokenRate float64
	// BadTokenBurst is how many wrong tokens an address may send before it
	// is slowed down (default 5).
	BadTokenBurst int
	// MaxSignerQueue is the hard bound on requests holding or waiting for
	// the signer; beyond it the request whose worker was seen last gets
	// ResourceExhausted at once (default 1024).
	MaxSignerQueue int
	// MaxSignerWait is the deadline of a request that carries none. A
	// request waits for the signer in line until its deadline, the
	// client's gRPC deadline (a Talos worker's attempt: 10 s) or, without
	// one, arrival plus this (default 2s); it reaches the device only if
	// it can finish by then, and is answered ResourceExhausted just before
	// it otherwise.
	MaxSignerWait time.Duration
	// MaxPeers bounds the addresses tracked; idle ones are forgotten first
	// (default 65536).
	MaxPeers int
}

func (r RateLimits) withDefaults() RateLimits {
	if r.PerPeerRate == 0 {
		r.PerPeerRate = 1
	}
	if r.PerPeerBurst <= 0 {
		r.PerPeerBurst = 20
	}
	if r.BadTokenRate == 0 {
		r.BadTokenRate = 0.1
	}
	if r.BadTokenBurst <= 0 {
		r.BadTokenBurst = 5
	}
	if r.MaxSignerQueue == 0 {
		r.MaxSignerQueue = 1024
	}
	if r.MaxSignerWait == 0 {
		r.MaxSignerWait = 2 * time.Second
	}
	if r.MaxPeers == 0 {
		r.MaxPeers = 65536
	}
	return r
}

// limiter enforces RateLimits.
type limiter struct {
	cfg  RateLimits
	now  func() time.Time
	gate *signerGate

	mu    sync.Mutex
	peers map[netip.Addr]*peerLimits
}

type peerLimits struct {
	requests   *rate.Limiter
	badToken   *rate.Limiter
	badRequest *rate.Limiter // malformed requests under a valid token
	lastSeen   time.Time
}

func newLimiter(cfg RateLimits, now func() time.Time) *limiter {
	cfg = cfg.withDefaults()
	l := &limiter{cfg: cfg, now: now, peers: map[netip.Addr]*peerLimits{}}
	l.gate = newSignerGate(cfg.MaxSignerQueue, cfg.MaxSignerWait, now)
	return l
}

func (l *limiter) peer(a netip.Addr) *peerLimits {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	p, ok := l.peers[a]
	if !ok {
		if len(l.peers) >= l.cfg.MaxPeers {
			l.evictLocked(now)
		}
		p = &peerLimits{
			requests:   newRate(l.cfg.PerPeerRate, l.cfg.PerPeerBurst),
			badToken:   newRate(l.cfg.BadTokenRate, l.cfg.BadTokenBurst),
			badRequest: newRate(l.cfg.BadTokenRate, l.cfg.BadTokenBurst),
		}
		l.peers[a] = p
	}
	p.lastSeen = now
	return p
}

// newRate returns a token bucket, or nil (no limit) for a negative rate.
func newRate(r float64, burst int) *rate.Limiter {
	if r < 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(r), burst)
}

// allow takes one token from b; a nil bucket (no limit) always allows.
func allow(b *rate.Limiter, now time.Time) bool { return b == nil || b.AllowN(now, 1) }

// evictLocked forgets idle addresses to make room; a table still full of
// busy peers then drops half of them, whichever the map yields first.
func (l *limiter) evictLocked(now time.Time) {
	idle := time.Duration(float64(l.cfg.PerPeerBurst)/max(l.cfg.PerPeerRate, 0.001)) * time.Second
	for a, p := range l.peers {
		if now.Sub(p.lastSeen) > idle {
			delete(l.peers, a)
		}
	}
	if len(l.peers) < l.cfg.MaxPeers {
		return
	}
	n := 0
	for a := range l.peers {
		delete(l.peers, a)
		if n++; n >= l.cfg.MaxPeers/2 {
			break
		}
	}
}

// admit charges a request with a valid token to its address's budget.
func (l *limiter) admit(a netip.Addr) error {
	if !allow(l.peer(a.Unmap()).requests, l.now()) {
		return &limitError{reason: "too many requests from this address; retry later"}
	}
	return nil
}

// wrongToken charges a wrong token to its address's wrong-token budget:
// within it the client gets authErr, past it a slow-down. Only wrong
// tokens are charged here, and nothing else is refused because of it.
func (l *limiter) wrongToken(a netip.Addr, authErr error) error {
	if !allow(l.peer(a.Unmap()).badToken, l.now()) {
		return &limitError{reason: "too many requests with a wrong token from this address; fix the token (machine.token) and retry in a few seconds"}
	}
	return authErr
}

// badRequest charges a malformed request under a valid token to its
// address's bad-request budget (the wrong-token rate and burst): within
// it the client gets reqErr (nil: only the charge), past it a slow-down.
func (l *limiter) badRequest(a netip.Addr, reqErr error) error {
	if !allow(l.peer(a.Unmap()).badRequest, l.now()) {
		return &limitError{reason: "too many malformed requests with a valid token from this address; fix the client's CSR and retry in a few seconds"}
	}
	return reqErr
}
