package server

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// Limits bound what a certificate request may ask for.
type Limits struct {
	// MaxCSRBytes bounds the PEM request (default 64 KiB).
	MaxCSRBytes int
	// MaxSANs bounds DNS names plus IP addresses (default 64).
	MaxSANs int
	// MinRSABits is the smallest RSA key accepted (default and floor:
	// pki.MinRSABits).
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
		l.Validity = pki.DefaultWorkerValidity
	}
	return l
}

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
	csr, err := pki.ParseCSR(pemBytes, l.MinRSABits)
	if err != nil {
		return nil, badRequest("%v", err)
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
	r := &Request{CSR: csr.CertificateRequest, SHA256: hex.EncodeToString(sum[:]), KeyType: csr.KeyType}
	for _, d := range csr.DNSNames {
		if err := pki.CheckDNSName(d, pki.WorkerName); err != nil {
			return nil, badRequest("SAN %v", err)
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
	r.Subject = pki.WorkerSubject(csr.Subject)
	return r, nil
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
// profile, pki.NewWorkerCertificate: subject without Organization, the
// CSR's DNS and IP SANs only, EKU exactly [ServerAuth], the signature
// algorithm of the CA key, validity clamped to the CA's.
func Issue(r *Request, ca *x509.Certificate, key crypto.Signer, validity time.Duration, now time.Time, rnd io.Reader) (*pki.Issued, error) {
	cert, err := pki.NewWorkerCertificate(ca, key, pki.WorkerRequest{Subject: r.Subject, DNSNames: r.DNSNames, IPs: r.IPs, PublicKey: r.CSR.PublicKey}, validity, now, rnd)
	if err != nil {
		return nil, fmt.Errorf("worker certificate: %w", err)
	}
	return cert, nil
}
