package certlint

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/x509"
	"fmt"
	"net"
	"slices"

	"github.com/siderolabs/talos/pkg/machinery/role"
)

// talosLint is one rule of Talos's certificate profiles that RFC 5280
// does not express. check returns "" when c passes.
type talosLint struct {
	name  string
	kinds []Kind
	check func(c, issuer *x509.Certificate) string
}

var (
	leaves    = []Kind{Worker, Serving, Client}
	issued    = []Kind{Intermediate, Worker, Serving, Client}
	cas       = []Kind{Root, Intermediate}
	allKinds  = []Kind{Root, Intermediate, Worker, Serving, Client}
	serverEKU = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	clientEKU = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
)

// talosLints are the project's own lints. apid compares a client
// certificate's EKU list for equality and reads its Organization as
// roles; Go checks EKU down the whole chain; so each rule below closes a
// way in which a certificate would mean more than its profile says.
var talosLints = []talosLint{
	{"e_talos_server_eku_exactly_server_auth", []Kind{Worker, Serving, Intermediate}, ekuExactly(serverEKU)},
	{"e_talos_client_eku_exactly_client_auth", []Kind{Client}, ekuExactly(clientEKU)},
	{"e_talos_leaf_not_ca", leaves, leafNotCA},
	{"e_talos_worker_no_organization", []Kind{Worker, Serving}, noOrganization},
	{"e_talos_client_known_roles", []Kind{Client}, knownRoles},
	{"e_talos_ca_basic_constraints", cas, caConstraints},
	{"e_talos_intermediate_path_len_zero", []Kind{Intermediate}, pathLenZero},
	{"e_talos_ip_san_within_name_constraints", issued, ipsWithinConstraints},
	{"e_talos_validity_within_issuer", issued, validityWithinIssuer},
	{"e_talos_key_usage_for_key_type", allKinds, keyUsageForKeyType},
}

// talosFindings runs the Talos lints that apply to kind.
func talosFindings(c *x509.Certificate, kind Kind, issuer *x509.Certificate) []Finding {
	var out []Finding
	for _, l := range talosLints {
		if !slices.Contains(l.kinds, kind) {
			continue
		}
		if msg := l.check(c, issuer); msg != "" {
			out = append(out, Finding{Lint: l.name, Details: msg})
		}
	}
	return out
}

func ekuExactly(want []x509.ExtKeyUsage) func(c, _ *x509.Certificate) string {
	return func(c, _ *x509.Certificate) string {
		if len(c.UnknownExtKeyUsage) > 0 || !slices.Equal(c.ExtKeyUsage, want) {
			return fmt.Sprintf("ExtKeyUsage %v (unknown %v), want exactly %v", c.ExtKeyUsage, c.UnknownExtKeyUsage, want)
		}
		return ""
	}
}

func leafNotCA(c, _ *x509.Certificate) string {
	if c.IsCA || c.KeyUsage&x509.KeyUsageCertSign != 0 {
		return "a leaf certificate is a CA or may sign certificates"
	}
	return ""
}

func noOrganization(c, _ *x509.Certificate) string {
	if len(c.Subject.Organization) > 0 {
		return fmt.Sprintf("subject Organization %q would read as talosctl roles", c.Subject.Organization)
	}
	return ""
}

// knownRoles checks the talosctl roles: at least one, each a role Talos
// knows, none the proxies-only impersonator role, no repeats.
func knownRoles(c, _ *x509.Certificate) string {
	orgs := c.Subject.Organization
	if len(orgs) == 0 {
		return "no role in the subject Organization"
	}
	set, unknown := role.Parse(orgs)
	switch {
	case len(unknown) > 0:
		return fmt.Sprintf("unknown role(s) %q", unknown)
	case set.Includes(role.Impersonator):
		return "role os:impersonator is for API proxies only"
	case len(slices.Compact(slices.Sorted(slices.Values(orgs)))) != len(orgs):
		return "a role appears twice"
	}
	return ""
}

func caConstraints(c, _ *x509.Certificate) string {
	if !c.IsCA || !c.BasicConstraintsValid || c.KeyUsage&x509.KeyUsageCertSign == 0 {
		return "a CA needs basicConstraints cA=TRUE and keyUsage keyCertSign (RFC 5280 §4.2.1.3, §4.2.1.9)"
	}
	return ""
}

func pathLenZero(c, _ *x509.Certificate) string {
	if c.MaxPathLen != 0 || !c.MaxPathLenZero {
		return fmt.Sprintf("path length %d, want 0: a replica's intermediate issues leaves only", c.MaxPathLen)
	}
	return ""
}

// ipsWithinConstraints checks every IP SAN against the issuer's IP name
// constraints (RFC 5280 §4.2.1.10): a verifier would refuse the chain.
func ipsWithinConstraints(c, issuer *x509.Certificate) string {
	for _, ip := range c.IPAddresses {
		if len(issuer.PermittedIPRanges) > 0 && !rangesContain(issuer.PermittedIPRanges, ip) {
			return fmt.Sprintf("IP SAN %s is outside the issuer's permitted ranges %v", ip, issuer.PermittedIPRanges)
		}
		if rangesContain(issuer.ExcludedIPRanges, ip) {
			return fmt.Sprintf("IP SAN %s is inside the issuer's excluded ranges %v", ip, issuer.ExcludedIPRanges)
		}
	}
	return ""
}

func rangesContain(rs []*net.IPNet, ip net.IP) bool {
	return slices.ContainsFunc(rs, func(r *net.IPNet) bool { return r.Contains(ip) })
}

func validityWithinIssuer(c, issuer *x509.Certificate) string {
	if c.NotBefore.Before(issuer.NotBefore) || c.NotAfter.After(issuer.NotAfter) {
		return fmt.Sprintf("validity %s..%s is not inside the issuer's %s..%s", c.NotBefore, c.NotAfter, issuer.NotBefore, issuer.NotAfter)
	}
	return ""
}

// keyUsageForKeyType refuses encipherment usages an ECDSA or Ed25519 key
// cannot perform (RFC 8813 §3, RFC 8410 §5) and demands digitalSignature,
// which every profile here relies on.
func keyUsageForKeyType(c, _ *x509.Certificate) string {
	if c.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		return "keyUsage lacks digitalSignature"
	}
	bad := x509.KeyUsageKeyEncipherment | x509.KeyUsageDataEncipherment
	switch c.PublicKey.(type) {
	case ed25519.PublicKey:
		bad |= x509.KeyUsageKeyAgreement
	case *ecdsa.PublicKey:
	default:
		return ""
	}
	if c.KeyUsage&bad != 0 {
		return fmt.Sprintf("keyUsage %#x has an encipherment usage that a %T cannot perform", c.KeyUsage, c.PublicKey)
	}
	return ""
}
