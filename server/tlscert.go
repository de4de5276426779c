package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
	// CA returns the current issuing CA certificate.
	CA func() *x509.Certificate
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
	cert, err := pki.NewServingCertificate(si.CA(), si.Signer, &key.PublicKey, hosts, si.validity(), clockOrDefault(si.Clock)(), randOrDefault(si.Rand))
	if err != nil {
		return fmt.Errorf("issue serving certificate: %w", err)
	}
	si.Holder.Set(&tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert})
	si.Metrics.SetServingExpiry(cert.NotAfter, clockOrDefault(si.Clock)())
	if si.Logger != nil {
		si.Logger.Info("serving certificate issued", "sans", hosts, "not_after", cert.NotAfter, "serial", cert.SerialNumber.Text(16))
	}
	return nil
}

// NeedsRenewal reports whether the installed certificate has less than a
// third of its lifetime left (or none is installed).
func (si *SelfIssuer) NeedsRenewal() bool {
	c := si.Holder.Get()
	if c == nil || c.Leaf == nil {
		return true
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

func clockOrDefault(c func() time.Time) func() time.Time {
	if c == nil {
		return time.Now
	}
	return c
}
