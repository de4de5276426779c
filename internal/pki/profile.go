package pki

import (
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"strings"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certlint"
)

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
	ski, err := SubjectKeyID(key.Public())
	if err != nil {
		return nil, err
	}
	subject := pkix.Name{Organization: []string{o.Organization}}
	if o.Cluster != "" {
		subject.CommonName = o.Cluster
	}
	tmpl := &x509.Certificate{
		Subject:               subject,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		SubjectKeyId:          ski,
		AuthorityKeyId:        ski,
	}
	return issue(issuance{kind: certlint.Root, tmpl: tmpl, pub: key.Public(), key: key, lifetime: o.Validity, now: now, rand: r, verify: true})
}

// NewServingCertificate issues trustd's own TLS serving certificate for
// pub, valid for hosts (IP addresses become IP SANs, the rest DNS SANs
// under the OwnName rule); the first host is the CommonName. Zero
// validity means DefaultServingValidity.
func NewServingCertificate(ca *x509.Certificate, caKey crypto.Signer, pub crypto.PublicKey, hosts []string, validity time.Duration, now time.Time, r io.Reader) (*x509.Certificate, error) {
	ips, dns, err := SplitHosts(hosts)
	if err != nil {
		return nil, err
	}
	if len(ips)+len(dns) == 0 {
		return nil, errors.New("serving certificate needs at least one IP address or DNS name")
	}
	if validity <= 0 {
		validity = DefaultServingValidity
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: firstHost(hosts)},
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IPAddresses:           ips,
		DNSNames:              dns,
	}
	return issue(issuance{kind: certlint.Serving, tmpl: tmpl, ca: ca, pub: pub, key: caKey, lifetime: validity, now: now, rand: r, verify: true})
}

// firstHost is the first non-blank host, the serving certificate's
// CommonName.
func firstHost(hosts []string) string {
	for _, h := range hosts {
		if h = strings.TrimSpace(h); h != "" {
			return h
		}
	}
	return ""
}

// NewClientCertificate issues a talosctl client certificate for pub:
// Organization = roles (see ParseRoles), KeyUsage DigitalSignature, EKU
// exactly [ClientAuth] (apid compares the list for equality). pub must
// pass CheckRequestKey. Zero validity means DefaultClientValidity; an
// empty commonName means "talosctl".
func NewClientCertificate(ca *x509.Certificate, caKey crypto.Signer, pub crypto.PublicKey, commonName string, roles []string, validity time.Duration, now time.Time, r io.Reader) (*x509.Certificate, error) {
	roles, err := ParseRoles(roles)
	if err != nil {
		return nil, err
	}
	if validity <= 0 {
		validity = DefaultClientValidity
	}
	if commonName == "" {
		commonName = "talosctl"
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: commonName, Organization: roles},
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	return issue(issuance{kind: certlint.Client, tmpl: tmpl, ca: ca, pub: pub, key: caKey, lifetime: validity, now: now, rand: r, verify: true, checkKey: true})
}

// WorkerRequest is what a worker's apid certificate is issued for: the
// subject and SANs taken from its checked CSR.
type WorkerRequest struct {
	// Subject is the CSR subject as WorkerSubject returns it.
	Subject pkix.Name
	// DNSNames (WorkerName rule) and IPs are the SANs.
	DNSNames []string
	IPs      []net.IP
	// PublicKey is the CSR's key (checked by ParseCSR).
	PublicKey crypto.PublicKey
}

// NewWorkerCertificate issues a worker's apid serving certificate with
// the trustd protocol's profile: the request's subject and DNS and IP
// SANs, KeyUsage DigitalSignature, EKU exactly [ServerAuth], not a CA,
// 128-bit random serial. The signature algorithm follows the CA key (the
// template leaves it unset), never the CSR: an Ed25519 CSR under an ECDSA
// CA must work for Talos 1.9 workers. This is the daemon's hot path, so
// unlike the ceremony's profiles it does not verify the new signature.
//
// It returns the certificate as signed, without parsing it again:
// x509.CreateCertificate has already checked the new signature against
// the CA's public key, which catches a faulty device.
func NewWorkerCertificate(ca *x509.Certificate, caKey crypto.Signer, w WorkerRequest, validity time.Duration, now time.Time, r io.Reader) (*Issued, error) {
	tmpl := &x509.Certificate{
		Subject:               w.Subject,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  false,
		DNSNames:              w.DNSNames,
		IPAddresses:           w.IPs,
	}
	der, warnings, err := sign(issuance{kind: certlint.Worker, tmpl: tmpl, ca: ca, pub: w.PublicKey, key: caKey, lifetime: validity, now: now, rand: r})
	if err != nil {
		return nil, err
	}
	// As encoded: UTCTime and GeneralizedTime carry whole seconds (RFC 5280 §4.1.2.5).
	return &Issued{Raw: der, SerialNumber: tmpl.SerialNumber, NotAfter: tmpl.NotAfter.Truncate(time.Second).UTC(), LintWarnings: warnings}, nil
}

// Issued is a certificate as it was signed: its DER and the fields the
// daemon's audit line needs, taken from the signing step rather than
// parsed again.
type Issued struct {
	// Raw is the DER certificate.
	Raw []byte
	// SerialNumber is its serial.
	SerialNumber *big.Int
	// NotAfter is the end of its validity.
	NotAfter time.Time
	// LintWarnings names the lints that warned (not refused) before signing.
	LintWarnings []string
}

// WorkerSubject copies a CSR subject without Organization (Talos does the
// same: an Organization would read as talosctl roles) and without
// ExtraNames, which could smuggle an Organization attribute back in.
func WorkerSubject(s pkix.Name) pkix.Name {
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

// issuance is one certificate to sign. A nil ca means self-signed.
type issuance struct {
	kind     certlint.Kind // the profile the lints check
	tmpl     *x509.Certificate
	ca       *x509.Certificate
	pub      crypto.PublicKey
	key      crypto.Signer
	lifetime time.Duration
	now      time.Time
	rand     io.Reader
	verify   bool // check the signature against the issuer
	checkKey bool // pub is someone else's key: CheckRequestKey
}

// issue fills in serial and validity, signs, and parses the result.
func issue(is issuance) (*x509.Certificate, error) {
	der, _, err := sign(is)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse issued certificate: %w", err)
	}
	if is.verify {
		if err := verifyIssued(cert, is.ca); err != nil {
			return nil, err
		}
	}
	return cert, nil
}

// sign completes is.tmpl (validity, serial), lints it and signs it (see
// lintThenSign); it returns the DER certificate and the lint warnings.
func sign(is issuance) ([]byte, []string, error) {
	if is.checkKey {
		if _, err := CheckRequestKey(is.pub, 0); err != nil {
			return nil, nil, err
		}
	}
	var err error
	if is.tmpl.NotBefore, is.tmpl.NotAfter, err = Validity(is.now, is.lifetime, is.ca); err != nil {
		return nil, nil, err
	}
	if is.tmpl.SerialNumber, err = SerialNumber(is.rand); err != nil {
		return nil, nil, err
	}
	return lintThenSign(is)
}

// verifyIssued checks the new signature, catching a device that signs
// wrongly before its certificate is written anywhere.
func verifyIssued(cert, ca *x509.Certificate) error {
	if ca == nil {
		ca = cert
	}
	if err := cert.CheckSignatureFrom(ca); err != nil {
		return fmt.Errorf("issued certificate does not verify against its issuer: %w", err)
	}
	return nil
}
