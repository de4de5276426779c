package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"strings"
	"testing"
	"time"
)

// rsaOfBits is an RSA public key of the given size; CheckRequestKey looks
// only at the size, so no key is generated.
func rsaOfBits(bits int) *rsa.PublicKey {
	return &rsa.PublicKey{N: new(big.Int).Lsh(big.NewInt(1), uint(bits-1)), E: 65537}
}

func TestCheckRequestKey(t *testing.T) {
	t.Parallel()
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	tests := []struct {
		name    string
		pub     crypto.PublicKey
		minRSA  int
		want    string
		wantErr string
	}{
		{"p256", &p256.PublicKey, 0, "ECDSA-P-256", ""},
		{"p224", &p224.PublicKey, 0, "", "unsupported ECDSA curve P-224"},
		{"ed25519", edPub, 0, "Ed25519", ""},
		{"rsa2048", rsaOfBits(2048), 0, "RSA-2048", ""},
		{"rsa8192", rsaOfBits(8192), 0, "RSA-8192", ""},
		{"rsa2047", rsaOfBits(2047), 0, "", "too small (minimum 2048)"},
		{"rsa1024 with a lower floor asked", rsaOfBits(1024), 1024, "", "too small (minimum 2048)"},
		{"rsa2048 under a 3072 floor", rsaOfBits(2048), 3072, "", "too small (minimum 3072)"},
		{"rsa8193", rsaOfBits(8193), 0, "", "too large (maximum 8192)"},
		{"other", "a string", 0, "", "unsupported public key type"},
	}
	for _, tt := range tests {
		got, err := CheckRequestKey(tt.pub, tt.minRSA)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: err = %v, want %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: = %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
}

func TestAllowsClientAuth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		eku  []x509.ExtKeyUsage
		unk  bool
		want bool
	}{
		{"no EKU", nil, false, true},
		{"Talos OS CA", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, false, true},
		{"any", []x509.ExtKeyUsage{x509.ExtKeyUsageAny}, false, true},
		{"server only", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, false, false},
		{"unknown only", nil, true, false},
	}
	for _, tt := range tests {
		c := &x509.Certificate{ExtKeyUsage: tt.eku, IsCA: true, BasicConstraintsValid: true}
		if tt.unk {
			c.UnknownExtKeyUsage = append(c.UnknownExtKeyUsage, []int{1, 2, 3, 4})
		}
		if got := AllowsClientAuth(c); got != tt.want {
			t.Errorf("%s: AllowsClientAuth = %v", tt.name, got)
		}
		if err := CheckClientCA(c); (err == nil) != tt.want {
			t.Errorf("%s: CheckClientCA = %v", tt.name, err)
		}
	}
	if err := CheckClientCA(&x509.Certificate{Subject: pkix.Name{CommonName: "leaf"}}); err == nil || !strings.Contains(err.Error(), "not a CA") {
		t.Errorf("a leaf passed CheckClientCA: %v", err)
	}
}

func TestValidity(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ca := &x509.Certificate{NotAfter: now.Add(10 * time.Hour)}
	tests := []struct {
		name         string
		lifetime     time.Duration
		issuer       *x509.Certificate
		now          time.Time
		wantNotAfter time.Time
		wantErr      string
	}{
		{"within the CA", time.Hour, ca, now, now.Add(time.Hour), ""},
		{"clamped to the CA", 24 * time.Hour, ca, now, ca.NotAfter, ""},
		{"self-signed", 24 * time.Hour, nil, now, now.Add(24 * time.Hour), ""},
		{"expired CA", time.Hour, ca, ca.NotAfter, time.Time{}, "has expired"},
		{"zero", 0, ca, now, time.Time{}, "must be positive"},
	}
	for _, tt := range tests {
		nb, na, err := Validity(tt.now, tt.lifetime, tt.issuer)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: err = %v, want %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !na.Equal(tt.wantNotAfter) || !nb.Equal(tt.now.Add(-Backdate)) {
			t.Errorf("%s: = %v, %v, %v", tt.name, nb, na, err)
		}
	}
}

func TestVerifySignature(t *testing.T) {
	t.Parallel()
	msg := []byte("steward-trustd key ceremony check")
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	for _, k := range []crypto.Signer{p256, ed} {
		opts, digest := crypto.SignerOpts(crypto.SHA256), msg
		if _, isEd := k.(ed25519.PrivateKey); isEd {
			opts = crypto.Hash(0)
		} else {
			sum := sha256Sum(msg)
			digest = sum
		}
		sig, err := k.Sign(rand.Reader, digest, opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := VerifySignature(k.Public(), msg, sig); err != nil {
			t.Errorf("%T: %v", k, err)
		}
		if err := VerifySignature(k.Public(), append(msg, '!'), sig); err == nil {
			t.Errorf("%T: a signature over another message verified", k)
		}
	}
}

func TestClientCertificateRefusesWeakKeys(t *testing.T) {
	t.Parallel()
	now := time.Now()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca, err := NewCACertificate(key, CAOptions{Cluster: "c"}, now, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	// sign-csr and talosconfig refuse what the daemon refuses.
	if _, err := NewClientCertificate(ca, key, rsaOfBits(1024), "", []string{"os:admin"}, 0, now, rand.Reader); err == nil || !strings.Contains(err.Error(), "too small") {
		t.Errorf("client certificate for an RSA-1024 key: %v", err)
	}
}

func sha256Sum(b []byte) []byte {
	s := sha256.Sum256(b)
	return s[:]
}

func TestParseFingerprint(t *testing.T) {
	t.Parallel()
	hex64 := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{hex64, hex64, true},
		{strings.ToUpper(hex64), hex64, true},
		{strings.TrimSuffix(strings.Repeat("AB:", 32), ":"), hex64, true},
		{"sha256:" + hex64, "", false},
		{hex64[:62], "", false},
		{hex64 + "ab", "", false},
		{strings.Repeat("zz", 32), "", false},
		{"", "", false},
	} {
		got, err := ParseFingerprint(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseFingerprint(%q) = %q, %v; want %q, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
