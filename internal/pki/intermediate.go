package pki

import (
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certlint"
)

// DefaultIntermediateValidity is the default lifetime of a serving
// intermediate: one year, so that a stolen (or merely forgotten)
// intermediate ends on its own, and a yearly re-enrolment is the habit.
const DefaultIntermediateValidity = 365 * 24 * time.Hour

// IntermediateOptions describe a serving intermediate.
type IntermediateOptions struct {
	// Subject of the intermediate (the CSR's, usually the node name).
	Subject pkix.Name
	// Validity is the lifetime; zero means DefaultIntermediateValidity.
	// It is clamped to the root's NotAfter.
	Validity time.Duration
	// PermittedIPRanges, when not empty, become an IP name constraint
	// (RFC 5280 section 4.2.1.10): every IP SAN issued under the
	// intermediate must fall inside one of them. DNS names stay
	// unconstrained (worker host names vary).
	PermittedIPRanges []*net.IPNet
}

// NewIntermediateCertificate issues, under the root, the intermediate
// that one trustd replica signs with: CA, path length 0 (it may issue
// leaves only), KeyUsage CertSign|DigitalSignature, EKU exactly
// [ServerAuth], SubjectKeyId and AuthorityKeyId, optional IP name
// constraints. Go checks EKU down the whole chain (crypto/x509
// verify.go, checkChainForKeyUsage), so a client certificate issued under
// it never verifies for ClientAuth: a compromised online signer cannot
// mint talosctl credentials. pub must pass CheckRequestKey.
func NewIntermediateCertificate(root *x509.Certificate, rootKey crypto.Signer, pub crypto.PublicKey, o IntermediateOptions, now time.Time, r io.Reader) (*x509.Certificate, error) {
	if o.Validity < 0 {
		return nil, errors.New("intermediate validity must be positive")
	}
	if o.Validity == 0 {
		o.Validity = DefaultIntermediateValidity
	}
	if !root.IsCA || !root.BasicConstraintsValid {
		return nil, fmt.Errorf("the signing certificate %q is not a CA", root.Subject)
	}
	ski, err := SubjectKeyID(pub)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		Subject:               o.Subject,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		SubjectKeyId:          ski,
		PermittedIPRanges:     o.PermittedIPRanges,
	}
	if len(o.PermittedIPRanges) > 0 {
		tmpl.PermittedDNSDomainsCritical = true
	}
	return issue(issuance{kind: certlint.Intermediate, tmpl: tmpl, ca: root, pub: pub, key: rootKey, lifetime: o.Validity, now: now, rand: r, verify: true, checkKey: true})
}

// CheckServerAuthCA checks one certificate of an issuer chain: a CA whose
// ExtKeyUsage is exactly [ServerAuth]. No EKU, or one with ClientAuth or
// Any, would let a client certificate minted under it pass apid's
// ClientAuth check (TestServerAuthIntermediateCannotMintClientCerts).
func CheckServerAuthCA(c *x509.Certificate) error {
	if !c.IsCA || !c.BasicConstraintsValid {
		return fmt.Errorf("certificate %q is not a CA", c.Subject)
	}
	// Go's verifier ignores KeyUsage; OpenSSL and others refuse a CA
	// without keyCertSign (RFC 5280 §4.2.1.3, §6.1.4 (n)).
	if c.KeyUsage&x509.KeyUsageCertSign == 0 {
		return fmt.Errorf("CA %q lacks keyUsage keyCertSign (RFC 5280 §4.2.1.3), so verifiers other than Go's refuse what it signs: re-issue it with steward-trustd-ceremony intermediate sign, which sets it", c.Subject)
	}
	switch {
	case len(c.ExtKeyUsage) == 0 && len(c.UnknownExtKeyUsage) == 0:
		return fmt.Errorf("CA %q has no ExtKeyUsage: a client certificate issued under it would be accepted by apid; issue it with EKU exactly [ServerAuth]", c.Subject)
	case slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageAny):
		return fmt.Errorf("CA %q has EKU anyExtendedKeyUsage: a client certificate issued under it would be accepted by apid; issue it with EKU exactly [ServerAuth]", c.Subject)
	case slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageClientAuth):
		return fmt.Errorf("CA %q allows ClientAuth: a client certificate issued under it would be accepted by apid; issue it with EKU exactly [ServerAuth]", c.Subject)
	case len(c.UnknownExtKeyUsage) > 0 || !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}):
		return fmt.Errorf("CA %q has EKU %s; want exactly [ServerAuth]", c.Subject, DescribeEKU(c))
	}
	return nil
}

// CheckIssuerChain checks an issuer chain (issuer.crt): the signing key's
// own certificate first, then any further intermediates, the root
// excluded. pub must be the first certificate's key; every certificate
// must pass CheckServerAuthCA; the first must have path length 0; each
// must be issued by the next; the chain must verify at now for ServerAuth
// to one of roots (os-ca.crt and accepted-cas.crt); and no certificate may
// outlive that root.
func CheckIssuerChain(chain, roots []*x509.Certificate, pub crypto.PublicKey, now time.Time) error {
	if len(chain) == 0 {
		return errors.New("no certificate")
	}
	if pub != nil && !KeyMatchesCert(pub, chain[0]) {
		return fmt.Errorf("the first certificate (%q) is not the signer key's: put the signing key's own certificate first", chain[0].Subject)
	}
	for i, c := range chain {
		if err := checkChainLink(chain, i, roots); err != nil {
			return err
		}
		if err := CheckServerAuthCA(c); err != nil {
			return err
		}
	}
	if first := chain[0]; first.MaxPathLen != 0 || !first.MaxPathLenZero {
		return fmt.Errorf("CA %q must have path length 0 (it issues leaves only)", first.Subject)
	}
	verified, err := verifyChain(chain, roots, now)
	if err != nil {
		return err
	}
	return checkWithinRoot(verified)
}

// checkWithinRoot refuses a certificate that outlives the root it
// verifies to: Go checks each certificate's validity at one instant, so
// such a chain passes today and stops working the day the root expires,
// while the intermediate still looks valid for longer. (A certificate
// outliving an intermediate above it is the operator's staggering; issued
// leaves are clamped to the chain's earliest NotAfter.) verified runs from
// chain[0] to the root.
func checkWithinRoot(verified []*x509.Certificate) error {
	root := verified[len(verified)-1]
	for _, c := range verified[:len(verified)-1] {
		if c.NotAfter.After(root.NotAfter) {
			return fmt.Errorf("certificate %q expires %s, after the root %q (%s): the chain stops working when the root expires; re-issue it with steward-trustd-ceremony intermediate sign (it never signs beyond the root), or rotate the root first",
				c.Subject, c.NotAfter.UTC().Format(time.RFC3339), root.Subject, root.NotAfter.UTC().Format(time.RFC3339))
		}
	}
	return nil
}

// checkChainLink refuses a root inside the chain and a chain out of
// order: chain[i] must be issued by chain[i+1].
func checkChainLink(chain []*x509.Certificate, i int, roots []*x509.Certificate) error {
	c := chain[i]
	if slices.ContainsFunc(roots, func(r *x509.Certificate) bool { return r.Equal(c) }) || c.CheckSignatureFrom(c) == nil {
		return fmt.Errorf("certificate %q is a root: leave the root out (it is os-ca.crt)", c.Subject)
	}
	if i+1 < len(chain) {
		if err := c.CheckSignatureFrom(chain[i+1]); err != nil {
			return fmt.Errorf("certificate %d (%q) is not issued by the next one (%q): order the chain from the signing key's certificate up: %w", i+1, c.Subject, chain[i+1].Subject, err)
		}
	}
	return nil
}

// verifyChain verifies chain to one of roots for ServerAuth at now and
// returns the verified path, chain[0] first and the root last.
func verifyChain(chain, roots []*x509.Certificate, now time.Time) ([]*x509.Certificate, error) {
	opts := x509.VerifyOptions{
		Roots:         x509.NewCertPool(),
		Intermediates: x509.NewCertPool(),
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, r := range roots {
		opts.Roots.AddCert(r)
	}
	for _, c := range chain[1:] {
		opts.Intermediates.AddCert(c)
	}
	paths, err := chain[0].Verify(opts)
	if err != nil {
		return nil, fmt.Errorf("does not verify to a CA of %s or %s: %w", "os-ca.crt", "accepted-cas.crt", err)
	}
	return paths[0], nil
}

// IssuerNotAfter is when an issuer chain stops working: the earliest
// NotAfter of its certificates.
func IssuerNotAfter(chain []*x509.Certificate) time.Time {
	var t time.Time
	for _, c := range chain {
		if t.IsZero() || c.NotAfter.Before(t) {
			t = c.NotAfter
		}
	}
	return t
}

// DescribeEKU names a certificate's ExtKeyUsage for people: "none" when
// it has no extension (which allows every usage), else the usages in
// order, e.g. "[ServerAuth]".
func DescribeEKU(c *x509.Certificate) string {
	if len(c.ExtKeyUsage) == 0 && len(c.UnknownExtKeyUsage) == 0 {
		return "none (any usage)"
	}
	var names []string
	for _, u := range c.ExtKeyUsage {
		names = append(names, ekuName(u))
	}
	for _, u := range c.UnknownExtKeyUsage {
		names = append(names, u.String())
	}
	return fmt.Sprint(names)
}

func ekuName(u x509.ExtKeyUsage) string {
	switch u {
	case x509.ExtKeyUsageServerAuth:
		return "ServerAuth"
	case x509.ExtKeyUsageClientAuth:
		return "ClientAuth"
	case x509.ExtKeyUsageAny:
		return "Any"
	case x509.ExtKeyUsageCodeSigning:
		return "CodeSigning"
	case x509.ExtKeyUsageEmailProtection:
		return "EmailProtection"
	case x509.ExtKeyUsageTimeStamping:
		return "TimeStamping"
	case x509.ExtKeyUsageOCSPSigning:
		return "OCSPSigning"
	}
	return fmt.Sprintf("EKU(%d)", int(u))
}
