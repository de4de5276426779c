package keyutil

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/signer"
)

// TestRoundTrip: every algorithm a file key may have survives
// MarshalPrivateKeyPEM and ParsePrivateKeyPEM as the same key.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	for _, alg := range []signer.Algorithm{signer.ECDSAP256, signer.ECDSAP384, signer.RSA2048, signer.Ed25519} {
		t.Run(string(alg), func(t *testing.T) {
			t.Parallel()
			k, err := GenerateKey(rand.Reader, alg)
			if err != nil {
				t.Fatal(err)
			}
			data, err := MarshalPrivateKeyPEM(k)
			if err != nil {
				t.Fatal(err)
			}
			if b, _ := pem.Decode(data); b == nil || b.Type != "PRIVATE KEY" {
				t.Fatalf("not one PKCS#8 PEM block: %q", data)
			}
			back, err := ParsePrivateKeyPEM(data)
			if err != nil {
				t.Fatal(err)
			}
			pub, ok := back.Public().(interface{ Equal(x crypto.PublicKey) bool })
			if !ok || !pub.Equal(k.Public()) {
				t.Fatal("parsed key differs from the generated one")
			}
		})
	}
}

func TestGenerateKeyUnknownAlgorithm(t *testing.T) {
	t.Parallel()
	if _, err := GenerateKey(rand.Reader, "p521"); !errors.Is(err, signer.ErrUnsupportedAlgorithm) {
		t.Fatalf("GenerateKey(p521) = %v, want ErrUnsupportedAlgorithm", err)
	}
}

func TestParsePrivateKeyPEM(t *testing.T) {
	t.Parallel()
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	weak, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	sec1, err := x509.MarshalECPrivateKey(ec)
	if err != nil {
		t.Fatal(err)
	}
	enc := func(typ string, der []byte, h map[string]string) []byte {
		return pem.EncodeToMemory(&pem.Block{Type: typ, Headers: h, Bytes: der})
	}
	tests := []struct {
		name, wantErr string
		data          []byte
	}{
		{"sec1 after a certificate", "", append(enc("CERTIFICATE", []byte{1}, nil), enc("EC PRIVATE KEY", sec1, nil)...)},
		{"weak rsa", "too weak", enc("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(weak), nil)},
		{"legacy encrypted", "encrypted", enc("EC PRIVATE KEY", sec1, map[string]string{"DEK-Info": "AES-128-CBC,00"})},
		{"pkcs8 encrypted", "encrypted", enc("ENCRYPTED PRIVATE KEY", []byte{0x30}, nil)},
		{"no key", "no private key", enc("CERTIFICATE", []byte{1}, nil)},
		{"corrupt", "parse PRIVATE KEY", enc("PRIVATE KEY", []byte{0x30, 0x01}, nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParsePrivateKeyPEM(tt.data)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("ParsePrivateKeyPEM = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}
