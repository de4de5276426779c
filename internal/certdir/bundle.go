package certdir

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"

	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// TrustBundle is the `ca` bundle the daemon returns to workers, which
// apid uses as its client-CA pool: ca first, then the accepted CAs, each
// certificate once.
func TrustBundle(ca *x509.Certificate, accepted ...*x509.Certificate) []*x509.Certificate {
	return Unique(append([]*x509.Certificate{ca}, accepted...)...)
}

// Unique returns certs in order, each certificate (by its DER) once.
func Unique(certs ...*x509.Certificate) []*x509.Certificate {
	var out []*x509.Certificate
	for _, c := range certs {
		if !contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

func contains(certs []*x509.Certificate, c *x509.Certificate) bool {
	for _, o := range certs {
		if bytes.Equal(o.Raw, c.Raw) {
			return true
		}
	}
	return false
}

// ParseBundle parses the content of os-ca.crt (exactly one certificate)
// and accepted-cas.crt (optional: nil or blank means none) and returns
// the issuing CA and the TrustBundle. Every certificate must pass
// pki.CheckClientCA: the bundle becomes apid's client-CA pool.
func ParseBundle(caPEM, acceptedPEM []byte) (*x509.Certificate, []*x509.Certificate, error) {
	cas, err := parseCAs(caPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("OS CA certificate: %w", err)
	}
	if len(cas) != 1 {
		return nil, nil, fmt.Errorf("OS CA certificate: want exactly one certificate, found %d (put extra CAs in %s)", len(cas), FileAcceptedCAs)
	}
	if len(bytes.TrimSpace(acceptedPEM)) == 0 {
		return cas[0], TrustBundle(cas[0]), nil
	}
	accepted, err := parseCAs(acceptedPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("accepted CAs (%s): %w", FileAcceptedCAs, err)
	}
	return cas[0], TrustBundle(cas[0], accepted...), nil
}

func parseCAs(data []byte) ([]*x509.Certificate, error) {
	certs, err := pki.ParseCertificates(data)
	if err != nil {
		return nil, err
	}
	for _, c := range certs {
		if err := pki.CheckClientCA(c); err != nil {
			return nil, err
		}
	}
	return certs, nil
}

// ReadBundle reads os-ca.crt, accepted-cas.crt and its trust statement
// (both may be missing) from r and returns the root and the bundle the
// daemon serves: ParseTrust of them.
func ReadBundle(r Reader) (*x509.Certificate, []*x509.Certificate, error) {
	caPEM, err := r.ReadFile(FileCACert)
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", FileCACert, err)
	}
	acceptedPEM, err := readOptional(r, FileAcceptedCAs)
	if err != nil {
		return nil, nil, err
	}
	statement, err := readOptional(r, FileTrustStatement)
	if err != nil {
		return nil, nil, err
	}
	t, err := ParseTrust(caPEM, acceptedPEM, statement)
	if err != nil {
		return nil, nil, err
	}
	return t.CA, t.Bundle, nil
}

// ClientTrust is the `ca` bundle of a talosconfig, with which talosctl
// verifies apid's serving certificate: the signing CA plus the CAs of
// os-ca.crt, accepted-cas.crt and os-ca.next.crt where r has them, so
// that a talosconfig made during a rotation keeps verifying apid after
// it.
func ClientTrust(ca *x509.Certificate, r Reader) ([]*x509.Certificate, error) {
	var more []*x509.Certificate
	for _, n := range []string{FileCACert, FileAcceptedCAs, FileNextCACert} {
		data, err := readOptional(r, n)
		if err != nil || data == nil {
			if err != nil {
				return nil, err
			}
			continue
		}
		certs, err := pki.ParseCertificates(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		more = append(more, certs...)
	}
	return TrustBundle(ca, more...), nil
}

// readOptional reads name from r; a missing file is (nil, nil).
func readOptional(r Reader, name string) ([]byte, error) {
	b, err := r.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return b, nil
}
