// Package server is the Talos-compatible SecurityService: it authenticates
// workers by token, checks their CSR against the serving-certificate profile
// and policy, signs through a signer.Signer, and writes one audit line per
// decision.
package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

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
	metrics     *Metrics
	readiness   *Readiness
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

		metrics:   cfg.Metrics,
		readiness: cfg.Readiness,
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
	return s, nil
}

// SetCredentials swaps token, CA and bundle; requests in flight finish
// with the set they started with.
func (s *Service) SetCredentials(c *Credentials) {
	s.creds.Store(c)
	s.metrics.SetCAExpiry(c.CA().NotAfter, s.now())
}

// Credentials returns the current credentials.
func (s *Service) Credentials() *Credentials { return s.creds.Load() }

// Certificate implements the SecurityService RPC.
func (s *Service) Certificate(ctx context.Context, req *securityapi.CertificateRequest) (*securityapi.CertificateResponse, error) {
	start := s.now()
	creds := s.creds.Load()
	peerAddr := peerAddress(ctx)
	rec := auditRecord{peer: peerAddr, csrBytes: len(req.GetCsr())}
	resp, err := s.certificate(ctx, creds, req, peerAddr, &rec)
	rec.duration = s.now().Sub(start)
	s.writeAudit(ctx, rec, err)
	s.metrics.observeOutcome(outcome(err))
	return resp, toStatus(err)
}

func (s *Service) certificate(ctx context.Context, creds *Credentials, req *securityapi.CertificateRequest, peerAddr netip.AddrPort, rec *auditRecord) (*securityapi.CertificateResponse, error) {
	if err := s.limiter.admit(peerAddr.Addr()); err != nil {
		return nil, err
	}
	if err := checkToken(ctx, creds.token); err != nil {
		s.limiter.badToken(peerAddr.Addr())
		return nil, err
	}
	r, err := ParseRequest(req.GetCsr(), s.limits)
	if err != nil {
		return nil, err
	}
	rec.request = r
	if err := s.policy.Check(r, peerAddr.Addr()); err != nil {
		return nil, err
	}
	release, err := s.limiter.acquireSigner(ctx, lineKey(r))
	if err != nil {
		return nil, err
	}
	s.metrics.inflight(1)
	t0 := s.now()
	cert, err := Issue(r, creds.ca, s.signer, s.limits.Validity, s.now(), s.rand)
	s.metrics.inflight(-1)
	release()
	s.metrics.observeLate(ctx, err)
	s.metrics.observeSign(s.now().Sub(t0), signer.ErrorKind(err))
	s.signerState.observe(err)
	if s.readiness != nil {
		s.readiness.Observe(err)
	}
	if err != nil {
		return nil, &signError{err: err}
	}
	rec.serial = cert.SerialNumber.Text(16)
	rec.notAfter = cert.NotAfter
	return &securityapi.CertificateResponse{
		Ca:  creds.bundle,
		Crt: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}),
	}, nil
}

// checkToken compares the metadata token with want in constant time; both
// sides are hashed first so that not even the length leaks.
func checkToken(ctx context.Context, want []byte) error {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return &authError{reason: "no metadata"}
	}
	vals := md.Get("token")
	if len(vals) == 0 {
		return &authError{reason: "no token"}
	}
	if len(vals) > 1 {
		return &authError{reason: "several tokens"}
	}
	got := sha256.Sum256([]byte(vals[0]))
	exp := sha256.Sum256(want)
	if subtle.ConstantTimeCompare(got[:], exp[:]) != 1 {
		return &authError{reason: "wrong token"}
	}
	return nil
}

func peerAddress(ctx context.Context) netip.AddrPort {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.AddrPort{}
	}
	if tcp, ok := p.Addr.(*net.TCPAddr); ok {
		return tcp.AddrPort()
	}
	ap, err := netip.ParseAddrPort(p.Addr.String())
	if err != nil {
		return netip.AddrPort{}
	}
	return ap
}

type auditRecord struct {
	peer     netip.AddrPort
	csrBytes int
	request  *Request
	serial   string
	notAfter time.Time
	duration time.Duration
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
