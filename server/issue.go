package server

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/steward-trustd/steward-trustd/keystore"
)

// Limits bound what a certificate request may ask for.
type Limits struct {
	// MaxCSRBytes bounds the PEM request (default 64 KiB).
	MaxCSRBytes int
	// MaxSANs bounds DNS names plus IP addresses (default 64).
	MaxSANs int
	// MinRSABits is the smallest RSA key accepted (default 2048).
	MinRSABits int
	// Validity is the issued certificate's lifetime (default 24 h; workers
	// renew every 12 h, so it must stay above that).
	Validity time.Duration
}

func (l Limits) withDefaults() Limits {
	if l.MaxCSRBytes == 0 {
		l.MaxCSRBytes = 64 << 10
	}
	if l.MaxSANs == 0 {
		l.MaxSANs = 64
	}
	if l.MinRSABits == 0 {
		l.MinRSABits = 2048
	}
	if l.Validity == 0 {
		l.Validity = 24 * time.Hour
	}
	return l
}

// maxRSABits keeps a hostile CSR from making signature verification slow.
const maxRSABits = 8192

// backdate covers clock skew between trustd and the worker.
const backdate = 5 * time.Minute

// requestError is a problem with the client's request: InvalidArgument.
type requestError struct{ msg string }

func (e *requestError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &requestError{msg: fmt.Sprintf(format, args...)}
}

// policyError is a well-formed request our policy refuses: PermissionDenied.
type policyError struct{ msg string }

func (e *policyError) Error() string { return e.msg }

func denied(format string, args ...any) error {
	return &policyError{msg: fmt.Sprintf(format, args...)}
}

// Request is a parsed and checked certificate request.
type Request struct {
	CSR       *x509.CertificateRequest
	SHA256    string
	Subject   pkix.Name
	DNSNames  []string
	IPs       []net.IP
	KeyType   string
	Requested []string // SANs as requested, for the audit log
}

// ParseRequest parses a PEM CSR from a worker, verifies its signature and
// checks it against limits. Errors are request errors with a message fit
// for the client.
func ParseRequest(pemBytes []byte, l Limits) (*Request, error) {
	l = l.withDefaults()
	if len(pemBytes) == 0 {
		return nil, badRequest("empty certificate signing request")
	}
	if len(pemBytes) > l.MaxCSRBytes {
		return nil, badRequest("certificate signing request is %d bytes, limit %d", len(pemBytes), l.MaxCSRBytes)
	}
	sum := sha256.Sum256(pemBytes)
	block, rest := pem.Decode(pemBytes)
	if block == nil {
		return nil, badRequest("certificate signing request is not PEM")
	}
	if block.Type != "CERTIFICATE REQUEST" && block.Type != "NEW CERTIFICATE REQUEST" {
		return nil, badRequest("PEM block is %q, want CERTIFICATE REQUEST", block.Type)
	}
	if len(strings.TrimSpace(string(rest))) != 0 {
		return nil, badRequest("trailing data after the certificate signing request")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, badRequest("parse certificate signing request: %v", err)
	}
	keyType, err := checkKey(csr.PublicKey, l)
	if err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, badRequest("certificate signing request signature does not verify: %v", err)
	}
	if len(csr.URIs) > 0 || len(csr.EmailAddresses) > 0 {
		return nil, badRequest("certificate signing request asks for URI or e-mail SANs; only DNS names and IP addresses are issued")
	}
	n := len(csr.DNSNames) + len(csr.IPAddresses)
	if n == 0 {
		return nil, badRequest("certificate signing request has no DNS name or IP address SAN")
	}
	if n > l.MaxSANs {
		return nil, badRequest("certificate signing request has %d SANs, limit %d", n, l.MaxSANs)
	}
	r := &Request{CSR: csr, SHA256: hex.EncodeToString(sum[:]), KeyType: keyType}
	for _, d := range csr.DNSNames {
		if !validDNSName(d) {
			return nil, badRequest("SAN %q is not a valid DNS name", d)
		}
		r.DNSNames = append(r.DNSNames, d)
		r.Requested = append(r.Requested, d)
	}
	for _, ip := range csr.IPAddresses {
		if ip.IsUnspecified() || ip.IsMulticast() {
			return nil, badRequest("SAN %s is not a unicast address", ip)
		}
		r.IPs = append(r.IPs, ip)
		r.Requested = append(r.Requested, ip.String())
	}
	r.Subject = workerSubject(csr.Subject)
	return r, nil
}

// workerSubject copies the CSR subject without Organization (Talos does
// the same: an Organization would read as talosctl roles) and without
// ExtraNames, which could smuggle an Organization attribute back in.
func workerSubject(s pkix.Name) pkix.Name {
	return pkix.Name{
		CommonName:         s.CommonName,
		Country:            s.Country,
		Province:           s.Province,
		Locality:           s.Locality,
		StreetAddress:      s.StreetAddress,
		PostalCode:         s.PostalCode,
		OrganizationalUnit: s.OrganizationalUnit,
		SerialNumber:       s.SerialNumber,
	}
}

func checkKey(pub any, l Limits) (string, error) {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256(), elliptic.P384(), elliptic.P521():
			return "ECDSA-" + k.Curve.Params().Name, nil
		}
		return "", badRequest("unsupported ECDSA curve")
	case ed25519.PublicKey:
		return "Ed25519", nil
	case *rsa.PublicKey:
		bits := k.N.BitLen()
		if bits < l.MinRSABits {
			return "", badRequest("RSA key of %d bits is too small (minimum %d)", bits, l.MinRSABits)
		}
		if bits > maxRSABits {
			return "", badRequest("RSA key of %d bits is too large (maximum %d)", bits, maxRSABits)
		}
		return fmt.Sprintf("RSA-%d", bits), nil
	}
	return "", badRequest("unsupported public key type in certificate signing request")
}

func validDNSName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "*" {
			return false // no wildcard serving certificates
		}
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// Policy is the optional address policy on top of the certificate profile.
type Policy struct {
	// AllowedSANPrefixes, when non-empty, must contain every IP SAN.
	AllowedSANPrefixes []netip.Prefix
	// RequirePeerIP demands that the caller's address is one of the IP SANs.
	RequirePeerIP bool
}

// Check applies the policy to a request from peer (which may be invalid
// when the transport has no IP address).
func (p Policy) Check(r *Request, peer netip.Addr) error {
	if len(p.AllowedSANPrefixes) > 0 {
		for _, ip := range r.IPs {
			a, _ := netip.AddrFromSlice(ip)
			a = a.Unmap()
			if !prefixesContain(p.AllowedSANPrefixes, a) {
				return denied("IP SAN %s is outside the allowed ranges", a)
			}
		}
	}
	if p.RequirePeerIP {
		if !peer.IsValid() {
			return denied("peer address unknown; cannot check it against the IP SANs")
		}
		peer = peer.Unmap()
		for _, ip := range r.IPs {
			if a, ok := netip.AddrFromSlice(ip); ok && a.Unmap() == peer {
				return nil
			}
		}
		return denied("peer address %s is not among the requested IP SANs", peer)
	}
	return nil
}

func prefixesContain(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Issue signs the worker's apid serving certificate with the protocol's
// profile: subject without Organization, the CSR's DNS and IP SANs only,
// KeyUsage DigitalSignature, EKU exactly [ServerAuth], not a CA, 128-bit
// random serial. The signature algorithm follows the CA key (the template
// leaves it unset), never the CSR: an Ed25519 CSR under an ECDSA CA must
// work for Talos 1.9 workers. x509.CreateCertificate checks the new
// signature against the CA's public key, which catches a faulty device.
func Issue(r *Request, ca *x509.Certificate, key crypto.Signer, validity time.Duration, now time.Time, rnd io.Reader) (*Issued, error) {
	serial, err := keystore.SerialNumber(rnd)
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	if !notAfter.After(now) {
		return nil, errors.New("the OS CA certificate has expired")
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               r.Subject,
		NotBefore:             now.Add(-backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  false,
		DNSNames:              r.DNSNames,
		IPAddresses:           r.IPs,
	}
	der, err := x509.CreateCertificate(rnd, tmpl, ca, r.CSR.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("sign worker certificate: %w", err)
	}
	// As encoded: UTCTime and GeneralizedTime carry whole seconds (RFC 5280 §4.1.2.5).
	return &Issued{Raw: der, SerialNumber: serial, NotAfter: notAfter.Truncate(time.Second).UTC()}, nil
}

// Issued is a certificate as Issue signed it: its DER and the fields the
// audit line needs, taken from the signing step rather than parsed again.
type Issued struct {
	// Raw is the DER certificate.
	Raw []byte
	// SerialNumber is its serial.
	SerialNumber *big.Int
	// NotAfter is the end of its validity.
	NotAfter time.Time
}
