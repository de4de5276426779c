package attestation

import (
	"bytes"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/go-tpm/tpm2"
)

var (
	// oidEKCertificate is the TCG EK certificate EKU (TCG EK Credential
	// Profile §3.2.16, tcg-kp-EKCertificate).
	oidEKCertificate = asn1.ObjectIdentifier{2, 23, 133, 8, 1}
	// oidSubjectAltName is the SAN extension (RFC 5280 §4.2.1.6).
	oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}
)

// EKRoots is a bundle of EK certificate issuers: the self-signed
// certificates are trust anchors, the others intermediates. TPM vendors
// publish both; an operator concatenates them into one PEM file.
type EKRoots struct {
	roots, intermediates *x509.CertPool
	n, nRoots            int
}

// ParseEKRoots reads a PEM bundle. It refuses a bundle with no
// self-signed certificate: it would trust nothing.
func ParseEKRoots(data []byte) (*EKRoots, error) {
	r := &EKRoots{roots: x509.NewCertPool(), intermediates: x509.NewCertPool()}
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("EK root bundle: certificate %d: %w", r.n+1, err)
		}
		r.n++
		if bytes.Equal(c.RawIssuer, c.RawSubject) && c.CheckSignatureFrom(c) == nil {
			r.roots.AddCert(c)
			r.nRoots++
		} else {
			r.intermediates.AddCert(c)
		}
	}
	if r.nRoots == 0 {
		return nil, errors.New("EK root bundle holds no self-signed root certificate; give the TPM vendors' EK root CA certificates (PEM)")
	}
	return r, nil
}

// EKInfo describes a verified EK certificate.
type EKInfo struct {
	Subject string `json:"subject"`
	Issuer  string `json:"issuer"`
	// SHA256 is the hex SHA-256 of the DER certificate.
	SHA256 string `json:"sha256"`
	// Root is the subject of the root it chained to.
	Root string `json:"root"`
}

// verifyEKCertificate checks that der chains to roots (with chain as
// extra intermediates) and carries the EK EKU. EK certificates put the
// TPM manufacturer, model and version in a critical SAN holding only a
// directoryName, which Go's verifier does not process; like step-ca
// (acme/challenge.go doTPMAttestationFormat) we drop the SAN from the
// unhandled critical extensions before verifying.
func verifyEKCertificate(der []byte, chain [][]byte, roots *EKRoots, now time.Time) (*x509.Certificate, *EKInfo, error) {
	if roots == nil {
		return nil, nil, refuse(CheckEKCertificate, "no EK root bundle was given")
	}
	ek, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, refuse(CheckEKCertificate, "parse the EK certificate: %w", err)
	}
	ek.UnhandledCriticalExtensions = slices.DeleteFunc(slices.Clone(ek.UnhandledCriticalExtensions),
		func(o asn1.ObjectIdentifier) bool { return o.Equal(oidSubjectAltName) })
	inter := roots.intermediates.Clone()
	for i, c := range chain {
		ic, err := x509.ParseCertificate(c)
		if err != nil {
			return nil, nil, refuse(CheckEKCertificate, "parse EK chain certificate %d: %w", i+1, err)
		}
		inter.AddCert(ic)
	}
	chains, err := ek.Verify(x509.VerifyOptions{
		Roots: roots.roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return nil, nil, refuse(CheckEKCertificate, "EK certificate %q (issuer %q) does not chain to the EK root bundle: %w", ek.Subject, ek.Issuer, err)
	}
	if !slices.ContainsFunc(ek.UnknownExtKeyUsage, oidEKCertificate.Equal) {
		return nil, nil, refuse(CheckEKCertificate, "the certificate has no TCG EK certificate EKU %v", oidEKCertificate)
	}
	sum := sha256.Sum256(der)
	root := chains[0][len(chains[0])-1]
	return ek, &EKInfo{Subject: ek.Subject.String(), Issuer: ek.Issuer.String(), SHA256: hex.EncodeToString(sum[:]), Root: root.Subject.String()}, nil
}

// checkEKPublic checks that the presented EK area is the TCG RSA EK
// template (so that MakeCredential encrypts to a restricted decryption
// key whose policy needs the endorsement hierarchy) holding the
// certificate's public key.
func checkEKPublic(raw []byte, cert *x509.Certificate) (*tpm2.TPMTPublic, error) {
	pub, err := unmarshalPublic(raw)
	if err != nil {
		return nil, refuse(CheckEKPublic, "%w", err)
	}
	want := tpm2.RSAEKTemplate
	if pub.Type != want.Type || pub.NameAlg != want.NameAlg || pub.ObjectAttributes != want.ObjectAttributes ||
		!bytes.Equal(pub.AuthPolicy.Buffer, want.AuthPolicy.Buffer) {
		return nil, refuse(CheckEKPublic, "the EK public area is not the TCG RSA 2048 EK template")
	}
	parms, err := pub.Parameters.RSADetail()
	if err != nil {
		return nil, refuse(CheckEKPublic, "%w", err)
	}
	// The symmetric parameters decide how TPM2_ActivateCredential
	// decrypts the credential; they must be the template's.
	wantParms, err := want.Parameters.RSADetail()
	if err != nil || !bytes.Equal(tpm2.Marshal(parms), tpm2.Marshal(wantParms)) {
		return nil, refuse(CheckEKPublic, "the EK parameters are not the TCG RSA 2048 EK template's")
	}
	uniq, err := pub.Unique.RSA()
	if err != nil {
		return nil, refuse(CheckEKPublic, "%w", err)
	}
	key, err := tpm2.RSAPub(parms, uniq)
	if err != nil {
		return nil, refuse(CheckEKPublic, "%w", err)
	}
	certKey, ok := cert.PublicKey.(*rsa.PublicKey)
	if !ok || !certKey.Equal(key) {
		return nil, refuse(CheckEKPublic, "the EK public key differs from the EK certificate's")
	}
	return pub, nil
}

// unmarshalPublic decodes a TPMT_PUBLIC exactly (no trailing bytes), so
// that its name is the hash of exactly these bytes.
func unmarshalPublic(raw []byte) (*tpm2.TPMTPublic, error) {
	pub, err := tpm2.Unmarshal[tpm2.TPMTPublic](raw)
	if err != nil {
		return nil, fmt.Errorf("decode TPMT_PUBLIC: %w", err)
	}
	if !bytes.Equal(tpm2.Marshal(pub), raw) {
		return nil, errors.New("TPMT_PUBLIC has trailing or non-canonical bytes")
	}
	return pub, nil
}
