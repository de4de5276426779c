package workerclient

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/pki"
)

func TestNewCSRIsAcceptedByTheDaemonsParser(t *testing.T) {
	for _, kt := range []KeyType{KeyP256, KeyEd25519} {
		_, csrPEM, err := NewCSR(rand.Reader, kt, &x509.CertificateRequest{
			Subject: pkix.Name{CommonName: "w"}, DNSNames: []string{"w"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		})
		if err != nil {
			t.Fatal(err)
		}
		csr, err := pki.ParseCSR(csrPEM, 0)
		if err != nil || len(csr.DNSNames) != 1 || len(csr.IPAddresses) != 1 {
			t.Errorf("%s: %v", kt, err)
		}
	}
	if _, _, err := NewCSR(rand.Reader, "rsa", &x509.CertificateRequest{}); err == nil {
		t.Error("unknown key type accepted")
	}
}

func TestKeyTypes(t *testing.T) {
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if KeyTypeFor(edPub) != KeyEd25519 || KeyTypeFor(&p256.PublicKey) != KeyP256 {
		t.Error("KeyTypeFor does not follow the CA key as a Talos 1.10+ worker does")
	}
	for s, ok := range map[string]bool{"p256": true, "ed25519": true, "rsa": false, "": false} {
		if _, err := ParseKeyType(s); (err == nil) != ok {
			t.Errorf("ParseKeyType(%q) = %v", s, err)
		}
	}
}

func TestCheck(t *testing.T) {
	now := time.Now()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca, _ := pki.NewCACertificate(caKey, pki.CAOptions{Cluster: "c"}, now, rand.Reader)
	otherKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	other, _ := pki.NewCACertificate(otherKey, pki.CAOptions{Cluster: "other"}, now, rand.Reader)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf, err := pki.NewWorkerCertificate(ca, caKey, pki.WorkerRequest{DNSNames: []string{"w"}, PublicKey: leafKey.Public()}, time.Hour, now, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	crt, bundle := pemDER(leaf.Raw), pki.EncodeCertificates(ca)
	tiered, tieredLeaf := tieredResponse(t, ca, caKey, now)
	tests := []struct {
		name     string
		crt, ca  []byte
		wantPart Part
		wantLeaf []byte
	}{
		{"good", crt, bundle, "", leaf.Raw},
		{"tiered: leaf + intermediate under the root", tiered, bundle, "", tieredLeaf},
		{"tiered without the intermediate", tiered[:len(pemDER(tieredLeaf))], bundle, PartChain, nil},
		{"no crt", nil, bundle, PartCert, nil},
		{"bad ca", crt, []byte("junk"), PartCA, nil},
		{"other CA", crt, pki.EncodeCertificates(other), PartChain, nil},
	}
	for _, tt := range tests {
		resp, err := Check(tt.crt, tt.ca)
		if tt.wantPart == "" {
			if err != nil || !bytes.Equal(resp.Cert.Raw, tt.wantLeaf) || len(resp.Bundle) != 1 {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		var re *ResponseError
		if !errors.As(err, &re) || re.Part != tt.wantPart {
			t.Errorf("%s: err = %v, want a ResponseError about %s", tt.name, err, tt.wantPart)
		}
	}
}

func pemDER(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// tieredResponse is the `crt` of a tiered daemon: a worker certificate
// issued by an intermediate of root, followed by that intermediate.
func tieredResponse(t *testing.T, root *x509.Certificate, rootKey crypto.Signer, now time.Time) (crt, leafDER []byte) {
	t.Helper()
	interKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	inter, err := pki.NewIntermediateCertificate(root, rootKey, interKey.Public(), pki.IntermediateOptions{Subject: pkix.Name{CommonName: "node-a"}}, now, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf, err := pki.NewWorkerCertificate(inter, interKey, pki.WorkerRequest{DNSNames: []string{"w"}, PublicKey: leafKey.Public()}, time.Hour, now, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return append(pemDER(leaf.Raw), pki.EncodeCertificates(inter)...), leaf.Raw
}
