// Package certlint checks a certificate before the CA key signs it: the
// RFC 5280 family of github.com/zmap/zlint/v3 (the lint sources that
// apply to a private PKI, see registry.go) plus the Talos profile lints
// of this project (talos.go). The caller lints the to-be-signed bytes the
// device will sign, assembled with a placeholder signature (internal/pki's
// lintingSigner), before the device is asked.
//
// Lint errors refuse the certificate; warnings and notices are reported
// for the caller to count. The package keeps no mutable state: the lint
// registry is computed once and never changes.
package certlint

import (
	"crypto/x509"
	"fmt"
	"slices"
	"strings"

	zx509 "github.com/zmap/zcrypto/x509"
	"github.com/zmap/zlint/v3"
	"github.com/zmap/zlint/v3/lint"
)

// Kind is the profile a certificate is issued under; the Talos lints
// that apply depend on it.
type Kind string

// The certificate kinds steward-trustd issues.
const (
	// Root is the self-signed OS CA.
	Root Kind = "root"
	// Intermediate is a serving intermediate under the root (one per replica).
	Intermediate Kind = "intermediate"
	// Serving is trustd's own TLS serving certificate.
	Serving Kind = "serving"
	// Worker is a worker's apid serving certificate.
	Worker Kind = "worker"
	// Client is a talosctl client certificate.
	Client Kind = "client"
)

// Finding is one lint that did not pass.
type Finding struct {
	// Lint is the lint's name (zlint's, or e_talos_* for ours).
	Lint string
	// Details says what is wrong.
	Details string
}

// Result is the outcome of linting one certificate.
type Result struct {
	// Errors refuse the certificate.
	Errors []Finding
	// Warnings (zlint warnings and notices) do not.
	Warnings []Finding
	// Linted is the certificate as linted (with a placeholder signature).
	Linted *x509.Certificate
}

// Err is nil when r has no errors, else an *Error naming them.
func (r Result) Err(kind Kind) error {
	if len(r.Errors) == 0 {
		return nil
	}
	return &Error{Kind: kind, Findings: r.Errors}
}

// WarningNames lists the lints that warned, sorted.
func (r Result) WarningNames() []string { return names(r.Warnings) }

// Error refuses a certificate: the lints it fails.
type Error struct {
	Kind     Kind
	Findings []Finding
}

// Names lists the failed lints, sorted.
func (e *Error) Names() []string { return names(e.Findings) }

func (e *Error) Error() string {
	parts := make([]string, 0, len(e.Findings))
	for _, f := range e.Findings {
		parts = append(parts, f.Lint+": "+f.Details)
	}
	return fmt.Sprintf("%s certificate refused before signing, it fails lint(s) %s (%s); nothing was sent to the signing device: fix the request or the profile",
		e.Kind, strings.Join(e.Names(), ","), strings.Join(parts, "; "))
}

func names(fs []Finding) []string {
	out := make([]string, 0, len(fs))
	for _, f := range fs {
		out = append(out, f.Lint)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Check lints cert (DER, its signature a placeholder) as kind, issued by
// issuer (nil for a self-signed certificate).
func Check(der []byte, kind Kind, issuer *x509.Certificate) (Result, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return Result{}, fmt.Errorf("lint: parse certificate: %w", err)
	}
	zc, err := zx509.ParseCertificate(der)
	if err != nil {
		return Result{}, fmt.Errorf("lint: parse certificate for zlint: %w", err)
	}
	reg, err := registry()
	if err != nil {
		return Result{}, err
	}
	if issuer == nil {
		issuer = cert
	}
	r := Result{Linted: cert}
	addZlint(&r, reg, zlint.LintCertificateEx(zc, reg))
	r.Errors = append(r.Errors, talosFindings(cert, kind, issuer)...)
	return r, nil
}

// addZlint sorts zlint's results into r, in lint-name order.
func addZlint(r *Result, reg lint.Registry, rs *zlint.ResultSet) {
	var failed []string
	for name, res := range rs.Results {
		if res.Status >= lint.Notice {
			failed = append(failed, name)
		}
	}
	slices.Sort(failed)
	for _, name := range failed {
		res := rs.Results[name]
		f := Finding{Lint: name, Details: res.Details}
		if l := reg.ByName(name); f.Details == "" && l != nil {
			f.Details = l.Description
		}
		if res.Status >= lint.Error {
			r.Errors = append(r.Errors, f)
		} else {
			r.Warnings = append(r.Warnings, f)
		}
	}
}
