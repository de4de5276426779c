package tpm

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func mustAuthority(t *testing.T, k crypto.Signer) *tpmpolicy.Authority {
	t.Helper()
	a, err := tpmpolicy.NewAuthority(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mustBindingFor(t *testing.T, pcrs ...int) tpmpolicy.Binding {
	t.Helper()
	b, err := tpmpolicy.BindingForPCRs(pcrs)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// authorizedBlobPEM is the key blob file (a dummy private part) of a key
// under the authority a with binding b.
func authorizedBlobPEM(t *testing.T, a *tpmpolicy.Authority, b tpmpolicy.Binding) []byte {
	t.Helper()
	auths := []*tpmpolicy.Authority{a}
	policy, _, err := tpmpolicy.AuthorizedPolicy(auths, b.Ref())
	if err != nil {
		t.Fatal(err)
	}
	blob := &tpmpolicy.KeyBlob{
		Public:      tpm2.New2B(tpmpolicy.KeyTemplate(tpm2.TPMECCNistP256, policy, false)),
		Private:     tpm2.TPM2BPrivate{Buffer: []byte{1}},
		Authorities: auths,
		Binding:     b,
	}
	data, err := blob.MarshalPEM("test")
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestWithAuthorities(t *testing.T) {
	a, b := newKey(t), newKey(t)
	uri, err := WithAuthorities("tpm:path=/k;approvals=/d", []crypto.PublicKey{a.Public(), b.Public()})
	if err != nil {
		t.Fatal(err)
	}
	u, err := ParseURI(uri)
	if err != nil || len(u.Authorities) != 2 || u.Authorities[1].Fingerprint() != mustAuthority(t, b).Fingerprint() {
		t.Fatalf("ParseURI(%q) = %+v, %v", uri, u, err)
	}
	if strings.Contains(u.String(), "authority=") {
		t.Errorf("canonical form %q carries the creation-time authorities", u.String())
	}
	for name, tc := range map[string]struct {
		uri  string
		pubs []crypto.PublicKey
	}{
		"no approvals dir": {"tpm:path=/k", []crypto.PublicKey{a.Public()}},
		"twice":            {"tpm:path=/k;approvals=/d", []crypto.PublicKey{a.Public(), a.Public()}},
		"not tpm":          {"file:/k", []crypto.PublicKey{a.Public()}},
		"ed25519":          {"tpm:path=/k;approvals=/d", []crypto.PublicKey{struct{}{}}},
	} {
		if _, err := WithAuthorities(tc.uri, tc.pubs); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestBlobBindingAgainstURI: the blob's policy says how the key binds
// approvals; a URI that says otherwise (systemd=true for a v2 key,
// another pcrs= than the bound selection) is refused, and a URI that
// says nothing gets the blob's binding.
func TestBlobBindingAgainstURI(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b tpmpolicy.Binding) string {
		data := authorizedBlobPEM(t, mustAuthority(t, newKey(t)), b)
		path := dir + "/" + name
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return "tpm:path=" + path + ";approvals=" + dir
	}
	v2, sd := write("v2.tpmkey", mustBindingFor(t, 7)), write("systemd.tpmkey", tpmpolicy.SystemdBinding())
	tests := []struct {
		uri, wantMode string
		wantErr       bool
	}{
		{v2, "v2", false},
		{v2 + ";pcrs=7", "v2", false},
		{v2 + ";pcrs=0,7", "", true},
		{v2 + ";systemd=true", "", true},
		{sd, "systemd", false},
		{sd + ";systemd=true", "systemd", false},
	}
	for _, tt := range tests {
		u, err := ParseURI(tt.uri)
		if err != nil {
			t.Fatal(err)
		}
		k, err := readBlobFile(u)
		if tt.wantErr {
			if !errors.Is(err, signer.ErrInvalidURI) {
				t.Errorf("%s: %v, want ErrInvalidURI", tt.uri, err)
			}
			continue
		}
		if err != nil || k.binding.Mode() != tt.wantMode {
			t.Errorf("%s: binding %v, %v; want %s", tt.uri, k, err, tt.wantMode)
		}
	}
}
