package signer_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"math/big"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/keyutil"
	"github.com/steward-trustd/steward-trustd/signer"
)

// TestAlgorithmOfGenerated: the algorithm of a generated key is the one
// asked for (RSA 3072/4096 are covered by modulus size below: generating
// them costs seconds).
func TestAlgorithmOfGenerated(t *testing.T) {
	t.Parallel()
	for _, alg := range []signer.Algorithm{signer.ECDSAP256, signer.ECDSAP384, signer.RSA2048, signer.Ed25519} {
		t.Run(string(alg), func(t *testing.T) {
			t.Parallel()
			k, err := keyutil.GenerateKey(rand.Reader, alg)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := signer.AlgorithmOf(k.Public()); err != nil || got != alg {
				t.Fatalf("AlgorithmOf = %q, %v; want %q", got, err, alg)
			}
		})
	}
}

func TestAlgorithmOf(t *testing.T) {
	t.Parallel()
	rsaOf := func(bits uint) crypto.PublicKey {
		return &rsa.PublicKey{N: new(big.Int).Lsh(big.NewInt(1), bits-1), E: 65537}
	}
	p521, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		pub  crypto.PublicKey
		want signer.Algorithm
	}{
		{"rsa3072", rsaOf(3072), signer.RSA3072},
		{"rsa4096", rsaOf(4096), signer.RSA4096},
		{"rsa1024", rsaOf(1024), ""},
		{"rsa2047", rsaOf(2047), ""},
		{"p521", p521.Public(), ""},
		{"not a key", "p256", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := signer.AlgorithmOf(tt.pub)
			if got != tt.want {
				t.Fatalf("AlgorithmOf = %q, want %q", got, tt.want)
			}
			if (tt.want == "") != errors.Is(err, signer.ErrUnsupportedAlgorithm) {
				t.Fatalf("AlgorithmOf error = %v", err)
			}
		})
	}
}
