// Package keystore is the on-device key lifecycle of steward-trustd: the
// certificate profiles the OS CA issues (its own, trustd's serving
// certificate, talosctl client certificates) and the key ceremony built on
// them. It takes its clock and randomness as parameters so that ceremonies
// are testable.
package keystore

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/role"
)

// DefaultCAValidity is Talos's OS CA lifetime: 10 years.
const DefaultCAValidity = 87600 * time.Hour

// DefaultClientValidity is talosctl's default client certificate lifetime.
const DefaultClientValidity = 8760 * time.Hour

// DefaultServingValidity is the lifetime of trustd's own serving certificate.
const DefaultServingValidity = 365 * 24 * time.Hour

// backdate covers clock skew between the issuer and the verifier.
const backdate = 5 * time.Minute

// SerialNumber returns a positive serial of 128 random bits (RFC 5280
// section 4.1.2.2 allows up to 20 octets; CA/B Forum asks for 64+ bits).
func SerialNumber(r io.Reader) (*big.Int, error) {
	b := make([]byte, 16)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	b[0] |= 0x40 // keep 127+ significant bits, and positive
	b[0] &= 0x7f
	return new(big.Int).SetBytes(b), nil
}

// CAOptions describe the OS CA certificate.
type CAOptions struct {
	// Cluster names the CA in its CommonName.
	Cluster string
	// Organization is the subject's O; Talos uses "talos".
	Organization string
	// Validity is the lifetime; zero means DefaultCAValidity.
	Validity time.Duration
}

// NewCACertificate self-signs the OS CA certificate through key, with
// Talos's OS CA profile: CA, KeyUsage CertSign|DigitalSignature, EKU
// ServerAuth+ClientAuth (apid checks that every CA in a client chain
// allows ClientAuth), SubjectKeyId. The signature is verified before the
// certificate is returned.
func NewCACertificate(key crypto.Signer, o CAOptions, now time.Time, r io.Reader) (*x509.Certificate, error) {
	if o.Organization == "" {
		o.Organization = "talos"
	}
	if o.Validity == 0 {
		o.Validity = DefaultCAValidity
	}
	if o.Validity < 0 {
		return nil, errors.New("CA validity must be positive")
	}
	serial, err := SerialNumber(r)
	if err != nil {
		return nil, err
	}
	ski, err := subjectKeyID(key.Public())
	if err != nil {
		return nil, err
	}
	subject := pkix.Name{Organization: []string{o.Organization}}
	if o.Cluster != "" {
		subject.CommonName = o.Cluster
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               subject,
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(o.Validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		SubjectKeyId:          ski,
		AuthorityKeyId:        ski,
	}
	return sign(tmpl, tmpl, key.Public(), key, r)
}

// NewServingCertificate issues trustd's own TLS serving certificate for
// pub, valid for hosts (IP addresses become IP SANs, the rest DNS SANs).
func NewServingCertificate(ca *x509.Certificate, caKey crypto.Signer, pub crypto.PublicKey, hosts []string, validity time.Duration, now time.Time, r io.Reader) (*x509.Certificate, error) {
	if len(hosts) == 0 {
		return nil, errors.New("serving certificate needs at least one IP address or DNS name")
	}
	if validity <= 0 {
		validity = DefaultServingValidity
	}
	ips, dns, err := SplitHosts(hosts)
	if err != nil {
		return nil, err
	}
	serial, err := SerialNumber(r)
	if err != nil {
		return nil, err
	}
	cn := hosts[0]
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-backdate),
		NotAfter:              clampNotAfter(now.Add(validity), ca),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IPAddresses:           ips,
		DNSNames:              dns,
	}
	return sign(tmpl, ca, pub, caKey, r)
}

// ParseRoles parses talosctl role names (os:admin, os:operator, ...) with
// Talos's own role set. Unknown roles, os:impersonator (for proxies only)
// and an empty set are refused.
func ParseRoles(names []string) ([]string, error) {
	var clean []string
	for _, n := range names {
		if n = strings.TrimSpace(n); n != "" {
			clean = append(clean, n)
		}
	}
	if len(clean) == 0 {
		return nil, errors.New("no role given: a talosctl certificate needs at least one role, e.g. os:admin (Talos 1.14 rejects an empty role set)")
	}
	set, unknown := role.Parse(clean)
	if len(unknown) > 0 {
		return nil, fmt.Errorf("unknown role(s) %s (known: %s)", strings.Join(unknown, ", "), strings.Join(KnownRoles(), ", "))
	}
	if set.Includes(role.Impersonator) {
		return nil, fmt.Errorf("role %s is for API proxies only and is not issued to talosctl users", role.Impersonator)
	}
	return set.Strings(), nil
}

// KnownRoles lists the roles ParseRoles accepts.
func KnownRoles() []string {
	var out []string
	for _, r := range role.All.Strings() {
		if r != string(role.Impersonator) {
			out = append(out, r)
		}
	}
	return out
}

// NewClientCertificate issues a talosctl client certificate for pub:
// Organization = roles, KeyUsage DigitalSignature, EKU exactly
// [ClientAuth] (apid compares the list for equality).
func NewClientCertificate(ca *x509.Certificate, caKey crypto.Signer, pub crypto.PublicKey, commonName string, roles []string, validity time.Duration, now time.Time, r io.Reader) (*x509.Certificate, error) {
	roles, err := ParseRoles(roles)
	if err != nil {
		return nil, err
	}
	if validity <= 0 {
		validity = DefaultClientValidity
	}
	serial, err := SerialNumber(r)
	if err != nil {
		return nil, err
	}
	if commonName == "" {
		commonName = "talosctl"
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName, Organization: roles},
		NotBefore:             now.Add(-backdate),
		NotAfter:              clampNotAfter(now.Add(validity), ca),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	return sign(tmpl, ca, pub, caKey, r)
}

// SplitHosts splits host names into IP addresses and DNS names.
func SplitHosts(hosts []string) ([]net.IP, []string, error) {
	var ips []net.IP
	var dns []string
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
			continue
		}
		if !validDNSName(h) {
			return nil, nil, fmt.Errorf("%q is neither an IP address nor a DNS name", h)
		}
		dns = append(dns, strings.ToLower(h))
	}
	return ips, dns, nil
}

func validDNSName(s string) bool {
	if len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// clampNotAfter keeps a leaf from outliving its CA.
func clampNotAfter(t time.Time, ca *x509.Certificate) time.Time {
	if t.After(ca.NotAfter) {
		return ca.NotAfter
	}
	return t
}

func subjectKeyID(pub crypto.PublicKey) ([]byte, error) {
	fp, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("marshal public key: %w", err)
	}
	// RFC 7093 section 2 method 1: leftmost 160 bits of the SHA-256 of the key.
	sum := sha256.Sum256(fp)
	return sum[:20], nil
}

func sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer, r io.Reader) (*x509.Certificate, error) {
	der, err := x509.CreateCertificate(r, tmpl, parent, pub, key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse issued certificate: %w", err)
	}
	issuer := parent
	if tmpl == parent {
		issuer = cert
	}
	if err := cert.CheckSignatureFrom(issuer); err != nil {
		return nil, fmt.Errorf("issued certificate does not verify against its issuer: %w", err)
	}
	return cert, nil
}
