package server

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// CertHolder holds the serving TLS certificate and lets it be replaced
// while the server runs; handshakes pick up the new one at once.
type CertHolder struct {
	cert atomic.Pointer[tls.Certificate]
}

// Set replaces the serving certificate. cert.Leaf must be set.
func (h *CertHolder) Set(cert *tls.Certificate) { h.cert.Store(cert) }

// Get returns the current serving certificate (nil before the first Set).
func (h *CertHolder) Get() *tls.Certificate { return h.cert.Load() }

// GetCertificate is a tls.Config.GetCertificate callback.
func (h *CertHolder) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c := h.cert.Load()
	if c == nil {
		return nil, errors.New("no serving certificate yet")
	}
	return c, nil
}

// LoadKeyPair parses a PEM certificate and key into a tls.Certificate
// with Leaf set, refusing one that has expired.
func LoadKeyPair(certPEM, keyPEM []byte, now time.Time) (*tls.Certificate, error) {
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return nil, fmt.Errorf("serving certificate: %w", err)
		}
	}
	if now.After(c.Leaf.NotAfter) {
		return nil, fmt.Errorf("serving certificate expired at %s", c.Leaf.NotAfter.Format(time.RFC3339))
	}
	return &c, nil
}

// SelfIssuer issues trustd's own serving certificate through the signer
// when no server.crt/server.key is provided, and re-issues it before it
// expires. The serving key is an in-memory ECDSA P-256 key: it protects
// only this TLS endpoint, never the CA.
type SelfIssuer struct {
	// Holder receives each new certificate.
	Holder *CertHolder
	// Signer is the OS CA key.
	Signer signer.Signer
	// CA returns the current issuing CA certificate (the signer's).
	CA func() *x509.Certificate
	// Credentials, if set, takes the place of CA: the issuer and the
	// issuer chain sent after the leaf come from one snapshot. The
	// worker's trustd client trusts only the root (its accepted CAs), so
	// in the tiered setup it needs the intermediate from us.
	Credentials func() *Credentials
	// Hosts returns the IP addresses and DNS names to put in the SANs
	// (computed at each issuance: interface addresses may change).
	Hosts func() ([]string, error)
	// Validity of each certificate (default 7 days); it is renewed once a
	// third of it remains.
	Validity time.Duration
	// Clock, Rand and Logger; nil means time.Now, crypto/rand, discard.
	Clock  func() time.Time
	Rand   io.Reader
	Logger *slog.Logger
	// Metrics, if set, records the certificate's expiry.
	Metrics *Metrics
	// IssueLog, if set, must hold each certificate before it is served.
	IssueLog IssueLog
}

func (si *SelfIssuer) validity() time.Duration {
	if si.Validity <= 0 {
		return 7 * 24 * time.Hour
	}
	return si.Validity
}

// Issue issues a fresh certificate now and installs it.
func (si *SelfIssuer) Issue() error {
	hosts, err := si.Hosts()
	if err != nil {
		return fmt.Errorf("serving certificate SANs: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), randOrDefault(si.Rand))
	if err != nil {
		return fmt.Errorf("serving key: %w", err)
	}
	issuer, chain := si.issuer()
	hosts = permittedHosts(hosts, issuer)
	cert, err := pki.NewServingCertificate(issuer, si.Signer, &key.PublicKey, hosts, si.validity(), clockOrDefault(si.Clock)(), randOrDefault(si.Rand))
	if err == nil {
		err = logServing(si.IssueLog, cert, clockOrDefault(si.Clock)())
	}
	if err != nil {
		return fmt.Errorf("issue serving certificate: %w", err)
	}
	served := [][]byte{cert.Raw}
	for _, c := range chain {
		served = append(served, c.Raw)
	}
	si.Holder.Set(&tls.Certificate{Certificate: served, PrivateKey: key, Leaf: cert})
	si.Metrics.SetServingExpiry(cert.NotAfter, clockOrDefault(si.Clock)())
	if si.Logger != nil {
		si.Logger.Info("serving certificate issued", "sans", hosts, "not_after", cert.NotAfter, "serial", cert.SerialNumber.Text(16))
	}
	return nil
}

// issuer returns the issuing certificate and the chain to serve after
// the leaf.
func (si *SelfIssuer) issuer() (*x509.Certificate, []*x509.Certificate) {
	if si.Credentials == nil {
		return si.CA(), nil
	}
	c := si.Credentials()
	return c.Issuer(), c.Chain()
}

// NeedsRenewal reports whether the installed certificate has less than a
// third of its lifetime left (or none is installed).
func (si *SelfIssuer) NeedsRenewal() bool {
	c := si.Holder.Get()
	if c == nil || c.Leaf == nil {
		return true
	}
	if si.Credentials != nil && !sameChain(c.Certificate[1:], si.Credentials().Chain()) {
		return true // a new issuer.crt was loaded: serve its chain
	}
	life := c.Leaf.NotAfter.Sub(c.Leaf.NotBefore)
	return clockOrDefault(si.Clock)().After(c.Leaf.NotAfter.Add(-life / 3))
}

// Run re-issues the certificate when NeedsRenewal, checking every
// interval, until ctx ends. A failed renewal keeps the old certificate
// and is retried at the next check.
func (si *SelfIssuer) Run(ctx context.Context, interval time.Duration) {
	every(ctx, interval, func() {
		if !si.NeedsRenewal() {
			return
		}
		if err := si.Issue(); err != nil && si.Logger != nil {
			si.Logger.Error("serving certificate renewal failed; keeping the current one", "error", err)
		}
	})
}

// permittedHosts drops the IP addresses an issuer's IP name constraints
// (RFC 5280 section 4.2.1.10) do not permit: a serving certificate
// holding one would fail verification as a whole, so interface addresses
// outside the worker ranges (loopback, a pod network) are left out.
func permittedHosts(hosts []string, issuer *x509.Certificate) []string {
	if len(issuer.PermittedIPRanges) == 0 {
		return hosts
	}
	var out []string
	for _, h := range hosts {
		ip := net.ParseIP(strings.TrimSpace(h))
		if ip == nil || slices.ContainsFunc(issuer.PermittedIPRanges, func(n *net.IPNet) bool { return n.Contains(ip) }) {
			out = append(out, h)
		}
	}
	return out
}

func sameChain(served [][]byte, chain []*x509.Certificate) bool {
	if len(served) != len(chain) {
		return false
	}
	for i, c := range chain {
		if !bytes.Equal(served[i], c.Raw) {
			return false
		}
	}
	return true
}

func clockOrDefault(c func() time.Time) func() time.Time {
	if c == nil {
		return time.Now
	}
	return c
}
