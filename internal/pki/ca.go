package pki

import (
	"crypto/x509"
	"fmt"
)

// CheckCA reports whether c may issue certificates: basicConstraints
// cA TRUE (RFC 5280 §4.2.1.9) and keyUsage keyCertSign (§4.2.1.3). Go's
// verifier ignores KeyUsage, OpenSSL and others do not (§6.1.4 (n)), so
// a CA without keyCertSign would sign certificates that only Go accepts.
func CheckCA(c *x509.Certificate) error {
	if c == nil {
		return fmt.Errorf("a CA certificate is required")
	}
	if !c.IsCA || !c.BasicConstraintsValid {
		return fmt.Errorf("certificate %q is not a CA certificate (basicConstraints cA is not set)", c.Subject)
	}
	if c.KeyUsage&x509.KeyUsageCertSign == 0 {
		return fmt.Errorf("certificate %q is not a CA certificate (keyUsage lacks keyCertSign); re-issue it with keyCertSign", c.Subject)
	}
	return nil
}
