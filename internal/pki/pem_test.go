package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"strings"
	"testing"
	"time"
)

func TestParseCertificates(t *testing.T) {
	t.Parallel()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	a, _ := NewCACertificate(key, CAOptions{Cluster: "a"}, time.Now(), rand.Reader)
	b, _ := NewCACertificate(key, CAOptions{Cluster: "b"}, time.Now(), rand.Reader)
	two := EncodeCertificates(a, b)
	tests := []struct {
		name    string
		data    []byte
		n       int
		wantErr string
	}{
		{"two", two, 2, ""},
		{"empty", nil, 0, "no PEM CERTIFICATE"},
		{"truncated", two[:len(two)-40], 0, "trailing data"},
		{"key block", append(two, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}})...), 0, `"PRIVATE KEY"`},
	}
	for _, tt := range tests {
		got, err := ParseCertificates(tt.data)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: err = %v, want %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || len(got) != tt.n || !got[0].Equal(a) {
			t.Errorf("%s: %d certificates, %v", tt.name, len(got), err)
		}
	}
	if _, err := ParseCertificate(two); err == nil || !strings.Contains(err.Error(), "expected one") {
		t.Errorf("ParseCertificate of two: %v", err)
	}
}

func csrPEM(t *testing.T, key crypto.Signer, blockType string) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "alice"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
}

func TestParseCSR(t *testing.T) {
	t.Parallel()
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rsa1024, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	good := csrPEM(t, p256, "CERTIFICATE REQUEST")
	tests := []struct {
		name    string
		data    []byte
		wantErr string
	}{
		{"p256", good, ""},
		{"legacy block type", csrPEM(t, p256, "NEW CERTIFICATE REQUEST"), ""},
		{"not PEM", []byte("hello"), "not PEM"},
		{"certificate", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}}), "want CERTIFICATE REQUEST"},
		{"two requests", append(good, good...), "trailing data"},
		{"rsa1024", csrPEM(t, rsa1024, "CERTIFICATE REQUEST"), "too small"},
	}
	for _, tt := range tests {
		csr, err := ParseCSR(tt.data, 0)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: err = %v, want %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || csr.KeyType != "ECDSA-P-256" || csr.Subject.CommonName != "alice" {
			t.Errorf("%s: %+v, %v", tt.name, csr, err)
		}
	}
}
