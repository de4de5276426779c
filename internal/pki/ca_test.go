package pki

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"strings"
	"testing"
)

func TestCheckCA(t *testing.T) {
	t.Parallel()
	ca := func(edit func(*x509.Certificate)) *x509.Certificate {
		c := &x509.Certificate{Subject: pkix.Name{CommonName: "c"}, IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
		edit(c)
		return c
	}
	tests := []struct {
		name    string
		cert    *x509.Certificate
		wantErr string
	}{
		{"ca", ca(func(*x509.Certificate) {}), ""},
		{"nil", nil, "is required"},
		{"leaf", ca(func(c *x509.Certificate) { c.IsCA = false }), "basicConstraints"},
		{"no basic constraints", ca(func(c *x509.Certificate) { c.BasicConstraintsValid = false }), "basicConstraints"},
		{"no keyCertSign", ca(func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageDigitalSignature }), "keyCertSign"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := CheckCA(tt.cert)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("CheckCA = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}
