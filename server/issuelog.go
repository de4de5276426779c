package server

import (
	"context"
	"crypto/x509"
	"errors"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certlint"
	"github.com/steward-trustd/steward-trustd/internal/issuelog"
	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// IssueLog is the tamper-evident issuance log (internal/issuelog.Log):
// Append returns once the entry is durable.
type IssueLog interface {
	Append(ctx context.Context, entry []byte) (int64, error)
}

// logError is an issued certificate the log could not record: it is not
// sent (Unavailable, outcome log_error). Workers retry; the operator sees
// readiness fail and the alert.
type logError struct{ err error }

func (e *logError) Error() string { return "issuance log: " + e.err.Error() }
func (e *logError) Unwrap() error { return e.err }

// logIssued records an issued certificate; the certificate may leave
// only if it returns nil.
func (s *Service) logIssued(ctx context.Context, r *Request, cert *pki.Issued, rec *auditRecord) error {
	if s.issueLog == nil {
		return nil
	}
	e := issuelog.Issued(s.now(), string(certlint.Worker), cert.Raw, cert.SerialNumber.Text(16))
	e.Peer, e.Subject, e.CSRSHA256 = rec.peer.String(), r.Subject.String(), r.SHA256
	b, err := e.Marshal()
	if err == nil {
		_, err = s.issueLog.Append(ctx, b)
	}
	if err != nil {
		return &logError{err: err}
	}
	return nil
}

// logDenied records a refusal of a request that carried a valid token and
// a parsable CSR. Requests refused earlier (no or wrong token, malformed,
// rate-limited) are not logged: anyone can send them, and an append-only
// log must not grow at an attacker's pace; the audit line and metrics
// count them. A failure to log a refusal changes nothing for the client.
func (s *Service) logDenied(ctx context.Context, rec auditRecord, err error) {
	var le *logError
	if s.issueLog == nil || err == nil || rec.request == nil || errors.As(err, &le) {
		return
	}
	e := issuelog.Entry{Version: 1, Time: s.now().UTC(), Event: issuelog.EventDenied, Kind: string(certlint.Worker),
		Outcome: outcome(err), Reason: err.Error(), Peer: rec.peer.String(), Subject: rec.request.Subject.String(), CSRSHA256: rec.request.SHA256}
	if b, merr := e.Marshal(); merr == nil {
		_, _ = s.issueLog.Append(ctx, b) // a failure is reported by the log itself (one line per change, readiness)
	}
}

// IssueLog is the log the service records its decisions in, nil if none;
// the self-issuer logs the serving certificates in it.
func (s *Service) IssueLog() IssueLog { return s.issueLog }

// logServing records a self-issued serving certificate; it is served only
// if this returns nil.
func logServing(l IssueLog, cert *x509.Certificate, now time.Time) error {
	if l == nil {
		return nil
	}
	b, err := issuelog.Issued(now, string(certlint.Serving), cert.Raw, cert.SerialNumber.Text(16)).Marshal()
	if err == nil {
		_, err = l.Append(context.Background(), b)
	}
	if err != nil {
		return &logError{err: err}
	}
	return nil
}
