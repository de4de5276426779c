package keystore_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/certlint"
	"github.com/steward-trustd/steward-trustd/keystore"
)

// TestCeremonyRefusesALintedIntermediate: a request whose intermediate
// would have an empty subject (RFC 5280 §4.1.2.6 demands one for a CA) is
// refused with the lints' names, and the ceremony writes nothing: no
// issuer.crt, no receipt.
func TestCeremonyRefusesALintedIntermediate(t *testing.T) {
	c := newCeremony(t)
	root := t.TempDir()
	rootURI, rd := initCA(t, c, root)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	out := keystore.OSDir{Root: t.TempDir()}
	before := receiptOps(t, rd)
	sign := keystore.IntermediateSignOptions{SignerURI: rootURI, CA: mustCA(t, rd, certdir.FileCACert),
		CSR: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), Out: keystore.Target{Dir: out, Name: certdir.FileIssuerChain}}
	_, _, err = c.IntermediateSign(context.Background(), rd, sign)
	var lintErr *certlint.Error
	if !errors.As(err, &lintErr) || !slices.Contains(lintErr.Names(), "e_ca_subject_field_empty") || !strings.Contains(err.Error(), "e_ca_subject_field_empty") {
		t.Fatalf("err = %v, want a lint refusal naming e_ca_subject_field_empty", err)
	}
	if _, err := os.Stat(filepath.Join(out.Root, certdir.FileIssuerChain)); !os.IsNotExist(err) {
		t.Errorf("issuer.crt written for a refused certificate: %v", err)
	}
	if after := receiptOps(t, rd); !slices.Equal(before, after) {
		t.Errorf("receipts changed: %v -> %v", before, after)
	}
}
