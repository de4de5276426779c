package pki

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// PEM block types.
const (
	blockCertificate = "CERTIFICATE"
	blockCSR         = "CERTIFICATE REQUEST"
	blockCSRLegacy   = "NEW CERTIFICATE REQUEST" // older OpenSSL and Windows tools
)

// EncodeCertificates PEM-encodes certs in order.
func EncodeCertificates(certs ...*x509.Certificate) []byte {
	var buf bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&buf, &pem.Block{Type: blockCertificate, Bytes: c.Raw}) // a bytes.Buffer write cannot fail
	}
	return buf.Bytes()
}

// ParseCertificates parses every CERTIFICATE block of a PEM bundle; other
// block types are an error, and so is an empty bundle.
func ParseCertificates(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != blockCertificate {
			return nil, fmt.Errorf("unexpected PEM block %q in a certificate file", block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM CERTIFICATE block found")
	}
	// pem.Decode stops at what it cannot parse, so a truncated last block
	// would otherwise vanish silently.
	if len(bytes.TrimSpace(data)) > 0 {
		return nil, errors.New("trailing data after the last certificate: truncated or corrupted file")
	}
	return out, nil
}

// ParseCertificate parses a PEM file holding exactly one certificate.
func ParseCertificate(data []byte) (*x509.Certificate, error) {
	certs, err := ParseCertificates(data)
	if err != nil {
		return nil, err
	}
	if len(certs) != 1 {
		return nil, fmt.Errorf("expected one certificate, found %d", len(certs))
	}
	return certs[0], nil
}

// CSR is a certificate request whose key and signature were checked.
type CSR struct {
	*x509.CertificateRequest
	// KeyType names the request's key for logs and receipts, e.g.
	// "ECDSA-P-256", "Ed25519", "RSA-2048".
	KeyType string
}

// ParseCSR parses exactly one PEM certificate request, checks its key
// with CheckRequestKey(minRSABits) and then verifies its signature (the
// key first, so that an oversized RSA key costs nothing to refuse).
// Messages are fit for the requester.
func ParseCSR(data []byte, minRSABits int) (*CSR, error) {
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, errors.New("certificate signing request is not PEM (want a CERTIFICATE REQUEST block)")
	}
	if block.Type != blockCSR && block.Type != blockCSRLegacy {
		return nil, fmt.Errorf("PEM block is %q, want CERTIFICATE REQUEST", block.Type)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("trailing data after the certificate signing request")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse certificate signing request: %w", err)
	}
	keyType, err := CheckRequestKey(csr.PublicKey, minRSABits)
	if err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certificate signing request signature does not verify: %w", err)
	}
	return &CSR{CertificateRequest: csr, KeyType: keyType}, nil
}

// EncodeCSR PEM-encodes a DER certificate request.
func EncodeCSR(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: blockCSR, Bytes: der})
}
