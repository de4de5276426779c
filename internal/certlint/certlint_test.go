package certlint

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"slices"
	"testing"
	"time"

	"github.com/zmap/zlint/v3/lint"
)

// TestRegistrySources checks that every lint source zlint knows is either
// run or left out with a reason, and that the exclusion list names lints
// that exist (a zlint upgrade renaming one fails here).
func TestRegistrySources(t *testing.T) {
	reg, err := registry()
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range lint.GlobalRegistry().Sources() {
		_, excluded := excludedSources[src]
		if included := slices.Contains(includedSources, src); included == excluded {
			t.Errorf("lint source %s: included %v, excluded %v; decide", src, included, excluded)
		}
	}
	for name := range excludedLints {
		if lint.GlobalRegistry().ByName(name) == nil || reg.ByName(name) != nil {
			t.Errorf("excluded lint %s: unknown to zlint or still run", name)
		}
	}
	if len(reg.Names()) < 100 {
		t.Errorf("only %d zlint lints run", len(reg.Names()))
	}
}

// TestCheckFindsRFC5280AndTalosErrors lints one certificate that breaks
// an RFC 5280 rule (zlint) and a Talos rule (ours) and one that breaks
// neither.
func TestCheckFindsRFC5280AndTalosErrors(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "w"}, DNSNames: []string{"w"}, NotBefore: now, NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, AuthorityKeyId: []byte{1, 2, 3, 4}}
	issuer := &x509.Certificate{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(2 * time.Hour)}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	r, err := Check(der, Worker, issuer)
	if err != nil || r.Err(Worker) != nil {
		t.Fatalf("a good worker certificate: %v %v", err, r.Err(Worker))
	}
	tmpl.KeyUsage |= x509.KeyUsageCertSign // without cA: RFC 5280 §4.2.1.3
	tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	der, _ = x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	r, err = Check(der, Worker, issuer)
	var lintErr *Error
	if err != nil || !errors.As(r.Err(Worker), &lintErr) {
		t.Fatalf("a bad worker certificate: %v %v", err, r.Err(Worker))
	}
	want := []string{"e_ext_key_usage_cert_sign_without_ca", "e_talos_leaf_not_ca", "e_talos_server_eku_exactly_server_auth"}
	for _, n := range want {
		if !slices.Contains(lintErr.Names(), n) {
			t.Errorf("lints %v lack %s", lintErr.Names(), n)
		}
	}
}
