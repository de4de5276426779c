package certdir

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/pki"
)

func newSignedCA(t *testing.T, key crypto.Signer) *x509.Certificate {
	t.Helper()
	ca, err := pki.NewCACertificate(key, pki.CAOptions{Cluster: "root"}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// TestTrustStatement: a statement verifies only for the root whose key
// signed it, with this format, within the bounds; ParseTrust serves only
// what it names.
func TestTrustStatement(t *testing.T) {
	rootKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	root, edRoot, other := newSignedCA(t, rootKey), newSignedCA(t, edKey), newCA(t, "other")
	a, b := newCA(t, "a"), newCA(t, "b")
	sign := func(key crypto.Signer, st TrustStatement) []byte {
		out, err := SignTrustStatement(key, rand.Reader, st)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	good := sign(rootKey, NewTrustStatement(root, 3, time.Now(), []*x509.Certificate{b, a, a}))
	tampered := bytes.Replace(good, []byte(`"statement": "`), []byte(`"statement": "X`), 1)
	wrongFormat := NewTrustStatement(root, 1, time.Now(), nil)
	wrongFormat.Format = "v0"
	tooMany := NewTrustStatement(root, 1, time.Now(), nil)
	for range MaxVouched + 1 {
		tooMany.CAs = append(tooMany.CAs, "x")
	}
	body, _ := json.Marshal(tooMany)
	sig, _ := pki.SignMessage(rootKey, rand.Reader, append([]byte(trustContext), body...))
	tooManyFile, _ := json.Marshal(signedStatement{Statement: body, Signature: sig})
	bare, _ := pki.SignMessage(rootKey, rand.Reader, body) // no context string
	bareFile, _ := json.Marshal(signedStatement{Statement: body, Signature: bare})
	tests := []struct {
		name string
		data []byte
		root *x509.Certificate
		want string
	}{
		{"ok", good, root, ""},
		{"ed25519 root", sign(edKey, NewTrustStatement(edRoot, 1, time.Now(), []*x509.Certificate{a})), edRoot, ""},
		{"other root", good, other, "not signed by the key"},
		{"statement for another root", sign(rootKey, NewTrustStatement(other, 1, time.Now(), nil)), root, "made for root"},
		{"tampered", tampered, root, "parse"},
		{"wrong format", sign(rootKey, wrongFormat), root, "format"},
		{"too many", tooManyFile, root, "more than"},
		{"signature without context", bareFile, root, "not signed"},
		{"unknown field", []byte(`{"statement":"","signature":"","x":1}`), root, "unknown field"},
		{"garbage", []byte("junk"), root, "parse"},
		{"oversized", make([]byte, maxStatementBytes+1), root, "larger"},
	}
	for _, tt := range tests {
		st, err := ParseTrustStatement(tt.data, tt.root)
		if tt.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		if err == nil || !errors.Is(err, ErrStatement) || !strings.Contains(err.Error(), tt.want) || st != nil {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
	if _, err := SignTrustStatement(rootKey, rand.Reader, tooMany); err == nil {
		t.Error("signed a statement over the bound")
	}
	tr, err := ParseTrust(pki.EncodeCertificates(root), pki.EncodeCertificates(a, other), good)
	if err != nil || len(tr.Bundle) != 2 || !tr.Bundle[1].Equal(a) || len(tr.Unvouched) != 1 || !tr.Unvouched[0].Equal(other) || tr.Sequence() != 3 {
		t.Errorf("ParseTrust: %+v, %v", tr, err)
	}
	if tr, _ := ParseTrust(pki.EncodeCertificates(other), pki.EncodeCertificates(a), good); tr.StatementErr == nil || len(tr.Bundle) != 1 {
		t.Errorf("statement of another root vouched: %+v", tr)
	}
}
