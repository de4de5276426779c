package certdir

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// A Talos worker takes trustd's `ca` bundle as apid's client-CA pool, so
// write access to accepted-cas.crt would choose who may administer the
// workers. The daemon therefore serves an accepted CA only when a
// statement signed by the root key (os-ca.crt) names it.

const (
	// TrustStatementFormat names version 1 of the statement.
	TrustStatementFormat = "steward-trustd/accepted-cas/v1"
	// trustContext is signed before the statement, so that no other
	// signature of the root key (a certificate, a CRL, a device check) can
	// be passed off as a statement.
	trustContext = "steward-trustd accepted-cas statement v1\n"
	// maxStatementBytes and MaxVouched bound what a reader parses.
	maxStatementBytes = 64 << 10
	// MaxVouched is the most CAs one statement may vouch for.
	MaxVouched = 64
)

// ErrStatement wraps every reason a statement is refused.
var ErrStatement = errors.New("trust statement refused")

// TrustStatement is what the root signs: the CAs, besides itself, that
// the daemon may return in `ca`. Sequence grows with every statement the
// ceremony writes, so an older statement (which may still name a CA
// removed since) is recognised and refused by a daemon that saw a newer
// one.
type TrustStatement struct {
	// Format is TrustStatementFormat.
	Format string `json:"format"`
	// Root is the SHA-256 fingerprint of the DER of the root certificate
	// whose key signed the statement.
	Root string `json:"root"`
	// Sequence orders statements; a daemon refuses one lower than the
	// highest it has seen.
	Sequence uint64 `json:"sequence"`
	// Time is when the statement was signed (for people; not checked).
	Time time.Time `json:"time"`
	// CAs are the SHA-256 fingerprints of the vouched CAs' DER, sorted.
	CAs []string `json:"cas"`
}

// signedStatement is the file: the statement's exact bytes and the root
// key's signature over trustContext followed by them.
type signedStatement struct {
	Statement []byte `json:"statement"`
	Signature []byte `json:"signature"`
}

// NewTrustStatement is the statement by root vouching for cas.
func NewTrustStatement(root *x509.Certificate, seq uint64, now time.Time, cas []*x509.Certificate) TrustStatement {
	return TrustStatement{Format: TrustStatementFormat, Root: pki.CertFingerprint(root), Sequence: seq, Time: now.UTC(), CAs: sortedFingerprints(cas)}
}

// sortedFingerprints is the CAs field for cas.
func sortedFingerprints(cas []*x509.Certificate) []string {
	fps := Fingerprints(Unique(cas...))
	slices.Sort(fps)
	return fps
}

// SignTrustStatement has the root key s sign st and returns the file's
// content (pki.SignMessage: SHA-256 for ECDSA and RSA, plain Ed25519).
func SignTrustStatement(s crypto.Signer, r io.Reader, st TrustStatement) ([]byte, error) {
	if len(st.CAs) > MaxVouched {
		return nil, fmt.Errorf("a statement vouches for at most %d CAs, not %d", MaxVouched, len(st.CAs))
	}
	body, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("marshal trust statement: %w", err)
	}
	sig, err := pki.SignMessage(s, r, append([]byte(trustContext), body...))
	if err != nil {
		return nil, fmt.Errorf("sign the trust statement with the root key: %w", err)
	}
	out, err := json.MarshalIndent(signedStatement{Statement: body, Signature: sig}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("marshal trust statement: %w", err)
	}
	return append(out, '\n'), nil
}

// ParseTrustStatement checks that data is a statement signed by root's
// key for root, and returns it. Every error wraps ErrStatement.
func ParseTrustStatement(data []byte, root *x509.Certificate) (*TrustStatement, error) {
	st, err := parseTrustStatement(data, root)
	if err != nil {
		return nil, fmt.Errorf("%w (%s): %w", ErrStatement, FileTrustStatement, err)
	}
	return st, nil
}

func parseTrustStatement(data []byte, root *x509.Certificate) (*TrustStatement, error) {
	if len(data) > maxStatementBytes {
		return nil, fmt.Errorf("larger than %d bytes", maxStatementBytes)
	}
	var f signedStatement
	if err := strictJSON(data, &f); err != nil {
		return nil, err
	}
	if err := pki.VerifySignature(root.PublicKey, append([]byte(trustContext), f.Statement...), f.Signature); err != nil {
		return nil, fmt.Errorf("not signed by the key of the root %s: %w", pki.CertFingerprint(root), err)
	}
	var st TrustStatement
	if err := strictJSON(f.Statement, &st); err != nil {
		return nil, err
	}
	switch {
	case st.Format != TrustStatementFormat:
		return nil, fmt.Errorf("format %q, want %q", st.Format, TrustStatementFormat)
	case st.Root != pki.CertFingerprint(root):
		return nil, fmt.Errorf("made for root %s, not for os-ca.crt %s", st.Root, pki.CertFingerprint(root))
	case len(st.CAs) > MaxVouched:
		return nil, fmt.Errorf("vouches for %d CAs, more than %d", len(st.CAs), MaxVouched)
	}
	return &st, nil
}

// strictJSON decodes one JSON value, refusing unknown fields and
// trailing data.
func strictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("parse: %w", err)
	}
	if dec.More() {
		return errors.New("parse: trailing data")
	}
	return nil
}

// Vouches reports whether the statement names c.
func (st *TrustStatement) Vouches(c *x509.Certificate) bool {
	return st != nil && slices.Contains(st.CAs, pki.CertFingerprint(c))
}

// SameSet reports whether st vouches for exactly cas (a ceremony re-run
// keeps a statement that already says what it would sign).
func (st *TrustStatement) SameSet(cas []*x509.Certificate) bool {
	return st != nil && slices.Equal(st.CAs, sortedFingerprints(cas))
}

// Fingerprints lists the SHA-256 fingerprints of certs, for logs.
func Fingerprints(certs []*x509.Certificate) []string {
	out := make([]string, 0, len(certs))
	for _, c := range certs {
		out = append(out, pki.CertFingerprint(c))
	}
	return out
}

// Trust is the `ca` bundle as the root decided it: os-ca.crt, then the
// CAs of accepted-cas.crt that the root's statement vouches for.
type Trust struct {
	// CA is os-ca.crt, the root (vouched for by being the root).
	CA *x509.Certificate
	// Bundle is what the daemon serves as `ca`.
	Bundle []*x509.Certificate
	// Unvouched are the CAs of accepted-cas.crt the statement does not
	// name (all of them without a valid statement): never served.
	Unvouched []*x509.Certificate
	// Statement is the verified statement; nil if absent or refused.
	Statement *TrustStatement
	// StatementErr is why a present statement was refused (wraps
	// ErrStatement).
	StatementErr error
}

// ParseTrust parses os-ca.crt and accepted-cas.crt as ParseBundle does
// and keeps in the bundle only the accepted CAs that statement (the
// content of FileTrustStatement; nil when absent) vouches for. A bad
// certificate is an error; a bad statement is recorded in StatementErr
// and vouches for nothing.
func ParseTrust(caPEM, acceptedPEM, statement []byte) (*Trust, error) {
	ca, all, err := ParseBundle(caPEM, acceptedPEM)
	if err != nil {
		return nil, err
	}
	t := &Trust{CA: ca, Bundle: []*x509.Certificate{ca}}
	if statement != nil {
		t.Statement, t.StatementErr = ParseTrustStatement(statement, ca)
	}
	for _, c := range all[1:] {
		if t.Statement.Vouches(c) {
			t.Bundle = append(t.Bundle, c)
		} else {
			t.Unvouched = append(t.Unvouched, c)
		}
	}
	return t, nil
}

// Sequence is the statement's sequence number, 0 without one.
func (t *Trust) Sequence() uint64 {
	if t.Statement == nil {
		return 0
	}
	return t.Statement.Sequence
}
