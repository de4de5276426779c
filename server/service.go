// Package server is the Talos-compatible SecurityService: it authenticates
// workers by token, checks their CSR against the serving-certificate profile
// and policy, signs through a signer.Signer, and writes one audit line per
// decision.
package server

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// Config configures a Service.
type Config struct {
	// Signer holds the OS CA key. Required.
	Signer signer.Signer
	// Credentials are the token, CA and bundle. Required; swap them later
	// with SetCredentials.
	Credentials *Credentials
	// Limits bound requests; zero values take defaults.
	Limits Limits
	// Policy is the optional address policy.
	Policy Policy
	// Logger receives operational logs. Nil discards.
	Logger *slog.Logger
	// Audit receives one line per decision. Nil uses Logger.
	Audit *slog.Logger
	// Tenant labels audit lines when one daemon serves several clusters.
	Tenant string
	// Clock returns the current time; nil means time.Now.
	Clock func() time.Time
	// Rand supplies serial numbers and signature randomness; nil means crypto/rand.
	Rand io.Reader
	// RateLimits bound load per address and on the signer.
	RateLimits RateLimits
	// Metrics, if set, receives counters and latencies.
	Metrics *Metrics
	// Readiness, if set, learns the outcome of every signature.
	Readiness *Readiness
	// IssueLog, if set, records every decision; an issued certificate
	// is sent only once it holds it.
	IssueLog IssueLog
	// Authorizer, if set, decides per machine after the static policy.
	Authorizer *Authorizer
}

// Service implements securityapi.SecurityServiceServer.
type Service struct {
	securityapi.UnimplementedSecurityServiceServer

	signer signer.Signer
	creds  atomic.Pointer[Credentials]
	limits Limits
	policy Policy
	log    *slog.Logger
	audit  *slog.Logger
	tenant string
	now    func() time.Time
	rand   io.Reader

	signerState signerState
	limiter     *limiter
	lintWarned  lintWarned
	issueLog    IssueLog
	metrics     *Metrics
	readiness   *Readiness
	authorizer  *Authorizer
}

// New builds a Service.
func New(cfg Config) (*Service, error) {
	if cfg.Signer == nil {
		return nil, fmt.Errorf("server: no signer")
	}
	if cfg.Credentials == nil {
		return nil, fmt.Errorf("server: no credentials")
	}
	s := &Service{
		signer: cfg.Signer,
		limits: cfg.Limits.withDefaults(),
		policy: cfg.Policy,
		log:    cfg.Logger,
		audit:  cfg.Audit,
		tenant: cfg.Tenant,
		now:    cfg.Clock,
		rand:   cfg.Rand,

		metrics:    cfg.Metrics,
		readiness:  cfg.Readiness,
		issueLog:   cfg.IssueLog,
		authorizer: cfg.Authorizer,
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.audit == nil {
		s.audit = s.log
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.rand == nil {
		s.rand = rand.Reader
	}
	if s.limits.Validity <= 12*time.Hour {
		return nil, fmt.Errorf("server: certificate validity %v must exceed the workers' 12 h renewal interval", s.limits.Validity)
	}
	s.creds.Store(cfg.Credentials)
	s.signerState.log = s.log
	s.limiter = newLimiter(cfg.RateLimits, s.now)
	s.limiter.gate.observe(s.log, s.metrics, cfg.Signer.Describe().Backend)
	s.metrics.SetCAExpiry(cfg.Credentials.CA().NotAfter, s.now())
	s.metrics.SetTokens(nil, cfg.Credentials.tokens.fingerprints())
	return s, nil
}

// SetCredentials swaps token, CA and bundle; requests in flight finish
// with the set they started with.
func (s *Service) SetCredentials(c *Credentials) {
	was := s.creds.Swap(c)
	s.metrics.SetCAExpiry(c.CA().NotAfter, s.now())
	s.metrics.SetTokens(was.tokens.fingerprints(), c.tokens.fingerprints())
}

// Credentials returns the current credentials.
func (s *Service) Credentials() *Credentials { return s.creds.Load() }

// Certificate implements the SecurityService RPC.
func (s *Service) Certificate(ctx context.Context, req *securityapi.CertificateRequest) (*securityapi.CertificateResponse, error) {
	streamFrom(ctx).markHandled()
	start := s.now()
	creds := s.creds.Load()
	peerAddr := peerAddress(ctx)
	rec := auditRecord{peer: peerAddr, csrBytes: len(req.GetCsr())}
	resp, err := s.certificate(ctx, creds, req, peerAddr, &rec)
	rec.duration = s.now().Sub(start)
	s.writeAudit(ctx, rec, err)
	s.logDenied(ctx, rec, err)
	s.metrics.observeOutcome(outcome(err))
	return resp, toStatus(err)
}

// issue signs through the signer gate. The gate slot and the in-flight
// gauge are released by defer: a panicking backend (answered Internal by
// the recovery interceptor) must not leak a slot each time.
func (s *Service) issue(ctx context.Context, r *Request, creds *Credentials) (*pki.Issued, error) {
	release, err := s.limiter.acquireSigner(ctx, lineKey(r))
	if err != nil {
		return nil, err
	}
	defer release()
	s.metrics.inflight(1)
	defer s.metrics.inflight(-1)
	t0 := s.now()
	cert, err := Issue(r, creds.Issuer(), s.signer, creds.validity(s.limits.Validity, t0), t0, s.rand)
	if lerr := s.observeLint(cert, err); lerr != nil {
		return nil, lerr
	}
	s.metrics.observeLate(ctx, err)
	s.metrics.observeSign(s.now().Sub(t0), signer.ErrorKind(err))
	s.signerState.observe(err)
	if s.readiness != nil {
		s.readiness.Observe(err)
	}
	if err != nil {
		return nil, &signError{err: err}
	}
	return cert, nil
}

func (s *Service) certificate(ctx context.Context, creds *Credentials, req *securityapi.CertificateRequest, peerAddr netip.AddrPort, rec *auditRecord) (*securityapi.CertificateResponse, error) {
	fp, err := s.authenticate(ctx, creds, peerAddr.Addr())
	if err != nil {
		return nil, err
	}
	r, err := ParseRequest(req.GetCsr(), s.limits)
	if err != nil {
		return nil, s.badRequest(peerAddr.Addr(), fp, err)
	}
	rec.request = r
	if err := s.policy.Check(r, peerAddr.Addr()); err != nil {
		return nil, err
	}
	if err := s.authorize(ctx, creds, r, peerAddr.Addr(), fp, &rec.authz); err != nil {
		return nil, err
	}
	// Only a request that passed the token and the request checks makes
	// its connection a worker's, and only while it lasts: a token is no
	// lease on a connection slot.
	streamFrom(ctx).authenticated()
	cert, err := s.issue(ctx, r, creds)
	if err != nil {
		return nil, err
	}
	rec.serial = cert.SerialNumber.Text(16)
	rec.notAfter = cert.NotAfter
	if err := s.logIssued(ctx, r, cert, rec); err != nil {
		return nil, err
	}
	return &securityapi.CertificateResponse{
		Ca:  creds.bundle,
		Crt: creds.withChain(cert.Raw),
	}, nil
}

// authenticate checks the token before any limit: a request with a valid
// token is never refused because of wrong tokens sent earlier from its
// address (workers behind one NAT or proxy share it), and wrong tokens
// are charged only to the wrong-token limit, never to the address's
// request budget that valid requests use.
func (s *Service) authenticate(ctx context.Context, creds *Credentials, a netip.Addr) (string, error) {
	idx, err := checkToken(ctx, creds.tokens)
	if err != nil {
		return "", s.limiter.wrongToken(a, err)
	}
	fp := creds.tokens.fingerprint(idx)
	s.metrics.tokenMatched(fp)
	return fp, s.limiter.admit(a)
}

// badRequest charges a malformed request under a valid token (an empty
// CSR, say) to its address's bad-request budget and counts it against
// the token's fingerprint: a client that holds the token gets no free
// refusals, and the operator sees which token it holds.
func (s *Service) badRequest(a netip.Addr, fingerprint string, err error) error {
	s.metrics.tokenBadRequest(fingerprint)
	return s.limiter.badRequest(a, err)
}

// checkToken finds the metadata token among the valid ones, in constant
// time (see tokenSet.match), and returns its index.
func checkToken(ctx context.Context, tokens tokenSet) (int, error) {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return -1, &authError{reason: "no metadata"}
	}
	vals := md.Get("token")
	if len(vals) == 0 {
		return -1, &authError{reason: "no token"}
	}
	if len(vals) > 1 {
		return -1, &authError{reason: "several tokens"}
	}
	idx := tokens.match([]byte(vals[0]))
	if idx < 0 {
		return -1, &authError{reason: "wrong token"}
	}
	return idx, nil
}

// refusedOversized accounts for a request that gRPC refused before the
// handler because its message exceeded the size limit: one audit line,
// the metric, and the same charge against the address's limits as any
// other request, so an oversized flood is neither invisible nor free.
func (s *Service) refusedOversized(ctx context.Context) {
	peerAddr := peerAddress(ctx)
	fp, authErr := s.authenticate(ctx, s.creds.Load(), peerAddr.Addr())
	err := &oversizeError{limit: s.limits.MaxCSRBytes}
	if authErr == nil {
		authErr = s.badRequest(peerAddr.Addr(), fp, nil)
	}
	if authErr != nil {
		err.also = authErr.Error()
	}
	s.writeAudit(ctx, auditRecord{peer: peerAddr}, err)
	s.metrics.observeOutcome(outcome(err))
}

func peerAddress(ctx context.Context) netip.AddrPort {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.AddrPort{}
	}
	return addrPortOf(p.Addr)
}

type auditRecord struct {
	peer     netip.AddrPort
	csrBytes int
	request  *Request
	serial   string
	notAfter time.Time
	duration time.Duration
	authz    authzRecord
}

func (s *Service) writeAudit(ctx context.Context, rec auditRecord, err error) {
	attrs := make([]slog.Attr, 0, 14) // every attribute below: one allocation
	attrs = append(attrs,
		slog.String("event", "certificate_request"),
		slog.String("outcome", outcome(err)),
		slog.String("peer", rec.peer.String()),
		slog.Int("csr_bytes", rec.csrBytes),
		slog.Float64("duration_ms", float64(rec.duration.Microseconds())/1000),
	)
	if s.tenant != "" {
		attrs = append(attrs, slog.String("tenant", s.tenant))
	}
	if r := rec.request; r != nil {
		attrs = append(attrs,
			slog.String("subject", r.Subject.String()),
			slog.Any("sans", sanList(r.Requested)),
			slog.String("key_type", r.KeyType),
			slog.String("csr_sha256", r.SHA256),
		)
	}
	if rec.serial != "" {
		attrs = append(attrs, slog.String("serial", rec.serial), slog.Time("not_after", rec.notAfter))
	}
	attrs = rec.authz.appendAttrs(attrs)
	level := slog.LevelInfo
	if err != nil {
		// The reason is ours (never the token) and may carry device detail.
		attrs = append(attrs, slog.String("reason", err.Error()))
		level = slog.LevelWarn
	}
	s.audit.LogAttrs(ctx, level, "certificate request", attrs...)
}

// signerState logs signer failures once per change of state, not once per
// request: a PCR policy failure would otherwise flood the log.
type signerState struct {
	log  *slog.Logger
	mu   sync.Mutex
	kind string // "" when healthy
}

func (st *signerState) observe(err error) {
	kind := signer.ErrorKind(err)
	st.mu.Lock()
	prev := st.kind
	st.kind = kind
	st.mu.Unlock()
	if prev == kind {
		return
	}
	if err == nil {
		st.log.Info("signer recovered", "previous_error", prev)
		return
	}
	st.log.Error("signer failing", "kind", kind, "error", err)
}
