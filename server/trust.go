package server

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
)

// reloadTrust is the trustd_reload_failed label of a file set refused
// because the root does not vouch for the `ca` set it would serve.
const reloadTrust = "trust"

// TrustError refuses a file set whose `ca` set the root did not vouch
// for. A Talos worker makes that set apid's client-CA pool, so the
// running set is kept (certdir.ParseTrust).
type TrustError struct {
	// Reason says what is wrong and what to do.
	Reason string
	// CAs are the fingerprints of the CAs concerned.
	CAs []string
}

func (e *TrustError) Error() string {
	if len(e.CAs) == 0 {
		return e.Reason
	}
	return e.Reason + " (CAs " + strings.Join(e.CAs, ", ") + ")"
}

// trustGuard remembers, for the life of the process, the highest trust
// statement sequence installed and what that statement said: a statement
// older than that may name a CA removed since, and one that reuses the
// number for another root or set of CAs would let whoever holds both
// switch between them.
type trustGuard struct {
	highSeq uint64
	high    *certdir.TrustStatement
}

// check decides whether next may replace running.
func (g *trustGuard) check(running, next *Credentials) error {
	t := next.Trust()
	switch {
	case t.StatementErr != nil:
		return &TrustError{Reason: fmt.Sprintf("%v; restore the statement the ceremony wrote, or re-vouch with `steward-trustd-ceremony trust add`", t.StatementErr), CAs: certdir.Fingerprints(t.Unvouched)}
	case len(t.Unvouched) > 0:
		return &TrustError{Reason: certdir.FileAcceptedCAs + " holds CAs the root does not vouch for; vouch for them with `steward-trustd-ceremony trust add --signer ROOT --ca os-ca.crt CA.crt`, or remove them", CAs: certdir.Fingerprints(t.Unvouched)}
	case t.Statement != nil && t.Sequence() < g.highSeq:
		return &TrustError{Reason: fmt.Sprintf("trust statement sequence %d is older than %d, already installed: a replayed statement; restore the newest one the ceremony wrote", t.Sequence(), g.highSeq), CAs: t.Statement.CAs}
	case g.conflicts(t.Statement):
		return &TrustError{Reason: fmt.Sprintf("trust statement sequence %d, already installed, now names another root or set of CAs: two statements under one number; restore the one the ceremony wrote last, or re-vouch (`steward-trustd-ceremony trust add`) to number a new one", t.Sequence()), CAs: t.Statement.CAs}
	case !running.CA().Equal(next.CA()) && !slices.ContainsFunc(running.trust.Bundle, next.CA().Equal):
		return &TrustError{Reason: certdir.FileCACert + " changed to a root the running root did not vouch for (a rotation vouches for the new root with `rotate --signer`); put the running os-ca.crt back", CAs: certdir.Fingerprints([]*x509.Certificate{next.CA()})}
	}
	return nil
}

// conflicts reports whether st reuses the installed sequence number for
// another root or another list of CAs (a re-signed statement of the same
// list, differing only in its time, does not).
func (g *trustGuard) conflicts(st *certdir.TrustStatement) bool {
	return st != nil && g.high != nil && st.Sequence == g.highSeq &&
		(st.Root != g.high.Root || !slices.Equal(st.CAs, g.high.CAs))
}

// installed records c's statement as the newest seen.
func (g *trustGuard) installed(c *Credentials) {
	if st := c.Trust().Statement; st != nil && st.Sequence >= g.highSeq {
		g.highSeq, g.high = st.Sequence, st
	}
}

// LogTrust reports at start what the daemon serves as `ca`: a WARN line
// with the fingerprints of the accepted CAs it leaves out (and
// trustd_reload_failed{what="trust"} 1) when the root did not vouch for
// every one.
func LogTrust(log *slog.Logger, c *Credentials, m *Metrics) {
	t := c.Trust()
	served := certdir.Fingerprints(t.Bundle)
	if len(t.Unvouched) == 0 && t.StatementErr == nil {
		log.Info("serving ca", "cas", served, "statement_sequence", t.Sequence())
		return
	}
	m.SetReloadFailed(reloadTrust, true)
	attrs := []any{"served", served, "not_served", certdir.Fingerprints(t.Unvouched)}
	if t.StatementErr != nil {
		attrs = append(attrs, "statement_error", t.StatementErr.Error())
	}
	log.Warn("accepted CAs the root does not vouch for are not served; vouch with `steward-trustd-ceremony trust add` or remove them from "+certdir.FileAcceptedCAs, attrs...)
}

// logServedChange logs at WARN every change of the `ca` set served.
func logServedChange(log *slog.Logger, running, next *Credentials) {
	was, now := certdir.Fingerprints(running.trust.Bundle), certdir.Fingerprints(next.trust.Bundle)
	added, removed := difference(now, was), difference(was, now)
	if len(added)+len(removed) == 0 {
		return
	}
	log.Warn("the ca set served to workers (their apid's client CAs) changed", "added", added, "removed", removed, "served", now, "statement_sequence", next.trust.Sequence())
}

// difference lists the elements of a not in b.
func difference(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	return out
}
