package signer_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/file"
)

// A registry opens key URIs with the backends a binary links; here the
// file backend alone. Generate refuses to replace a key; Open finds it.
func ExampleRegistry() {
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = os.RemoveAll(dir) }()
	reg, err := signer.NewRegistry(&file.Backend{})
	if err != nil {
		fmt.Println(err)
		return
	}
	uri := file.URI(filepath.Join(dir, "os-ca.key"))
	s, err := reg.Generate(context.Background(), uri, signer.ECDSAP256)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(signer.AlgorithmName(s.Public()), s.Close())
	_, err = reg.Generate(context.Background(), uri, signer.ECDSAP256)
	fmt.Println(errors.Is(err, signer.ErrKeyExists))
	s, err = reg.Open(context.Background(), uri)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = s.Close() }()
	fmt.Println(s.Describe().Backend)
	_, err = reg.Open(context.Background(), "vault:secret/os-ca")
	fmt.Println(errors.Is(err, signer.ErrInvalidURI), reg.Schemes())
	// Output:
	// ECDSA-P256 <nil>
	// true
	// file
	// true [file]
}

// CheckOpts refuses what crypto/x509 would never ask of a signer, before
// any device is touched.
func ExampleCheckOpts() {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		fmt.Println(err)
		return
	}
	digest := sha256.Sum256([]byte("tbsCertificate"))
	fmt.Println(signer.CheckOpts(key.Public(), digest[:], crypto.SHA256))
	err = signer.CheckOpts(key.Public(), digest[:], crypto.SHA384)
	fmt.Println(errors.Is(err, signer.ErrInvalidOptions))
	// Output:
	// <nil>
	// true
}

// ParseAlgorithm reads the names the command-line tools take.
func ExampleParseAlgorithm() {
	a, err := signer.ParseAlgorithm("p384")
	fmt.Println(a, err)
	_, err = signer.ParseAlgorithm("dsa")
	fmt.Println(errors.Is(err, signer.ErrUnsupportedAlgorithm))
	// Output:
	// p384 <nil>
	// true
}
