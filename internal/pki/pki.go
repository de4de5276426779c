// Package pki holds every PKI rule of steward-trustd in one place: the
// certificate profiles (the OS CA, trustd's serving certificate, talosctl
// client certificates and the workers' apid certificates), serial
// numbers, validity, DNS names, PEM codecs, fingerprints and the checks on
// keys and CAs. The daemon and the ceremony both issue through it, so a
// rule fixed here is fixed for both.
//
// It takes its clock and randomness as parameters and links nothing but
// the standard library, Talos's role names and the lints
// (internal/certlint), so the daemon can use it. Every certificate is
// linted before the CA key signs it (lintThenSign).
package pki

import "time"

// Backdate moves every NotBefore into the past, covering clock skew
// between the issuer and the verifier (a worker whose clock is a little
// behind must not see a "not yet valid" certificate).
const Backdate = 5 * time.Minute

// Default lifetimes of the profiles.
const (
	// DefaultCAValidity is Talos's OS CA lifetime: 10 years.
	DefaultCAValidity = 87600 * time.Hour
	// DefaultClientValidity is talosctl's default client certificate lifetime.
	DefaultClientValidity = 8760 * time.Hour
	// DefaultServingValidity is the lifetime of trustd's own serving certificate.
	DefaultServingValidity = 365 * 24 * time.Hour
	// DefaultWorkerValidity is the lifetime of a worker's apid certificate:
	// workers renew every 12 h, so it must stay above that.
	DefaultWorkerValidity = 24 * time.Hour
)
