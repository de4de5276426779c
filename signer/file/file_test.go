package file

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/keyutil"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/signertest"
)

func TestConformance(t *testing.T) {
	for _, alg := range []signer.Algorithm{signer.ECDSAP256, signer.ECDSAP384, signer.RSA2048, signer.Ed25519} {
		t.Run(string(alg), func(t *testing.T) {
			b := &Backend{}
			s, err := b.Generate(context.Background(), URI(filepath.Join(t.TempDir(), "k.pem")), alg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			signertest.Run(t, s, signertest.Options{})
		})
	}
}

func TestOpenFormats(t *testing.T) {
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rs, _ := rsa.GenerateKey(rand.Reader, 2048)
	weak, _ := rsa.GenerateKey(rand.Reader, 1024)
	sec1, _ := x509.MarshalECPrivateKey(ec)
	pkcs8, _ := x509.MarshalPKCS8PrivateKey(ec)
	ed, _ := keyutil.GenerateKey(rand.Reader, signer.Ed25519)
	edDER, _ := x509.MarshalPKCS8PrivateKey(ed)
	enc := func(typ string, der []byte, h map[string]string) []byte {
		return pem.EncodeToMemory(&pem.Block{Type: typ, Headers: h, Bytes: der})
	}
	cert := enc("CERTIFICATE", []byte{1, 2, 3}, nil)
	tests := []struct {
		name    string
		data    []byte
		mode    os.FileMode
		wantErr string
	}{
		{"sec1", enc("EC PRIVATE KEY", sec1, nil), 0o600, ""},
		{"pkcs8", enc("PRIVATE KEY", pkcs8, nil), 0o400, ""},
		{"pkcs1", enc("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rs), nil), 0o600, ""},
		{"talos ed25519", enc("ED25519 PRIVATE KEY", edDER, nil), 0o600, ""},
		{"cert before key", append(cert, enc("PRIVATE KEY", pkcs8, nil)...), 0o600, ""},
		{"group readable", enc("PRIVATE KEY", pkcs8, nil), 0o640, "group or others"},
		{"world readable", enc("PRIVATE KEY", pkcs8, nil), 0o604, "group or others"},
		{"weak rsa", enc("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(weak), nil), 0o600, "too weak"},
		{"encrypted", enc("EC PRIVATE KEY", sec1, map[string]string{"Proc-Type": "4,ENCRYPTED", "DEK-Info": "AES-128-CBC,00"}), 0o600, "encrypted"},
		{"garbage", []byte("not a key"), 0o600, "no private key"},
		{"corrupt der", enc("PRIVATE KEY", []byte{0x30, 0x01}, nil), 0o600, "parse PRIVATE KEY"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "k")
			if err := os.WriteFile(p, tt.data, tt.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, tt.mode); err != nil {
				t.Fatal(err)
			}
			s, err := (&Backend{}).Open(context.Background(), URI(p))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if d := s.Describe(); !d.Extractable || d.Backend != "file" {
					t.Fatalf("Describe = %+v", d)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Open error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestNoOverwriteAndNotFound(t *testing.T) {
	var logs bytes.Buffer
	b := &Backend{Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	p := filepath.Join(t.TempDir(), "k")
	ctx := context.Background()
	if _, err := b.Open(ctx, URI(p)); !errors.Is(err, signer.ErrKeyNotFound) {
		t.Fatalf("Open missing: %v, want ErrKeyNotFound", err)
	}
	s1, err := b.Generate(ctx, URI(p), signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(p)
	if _, err := b.Generate(ctx, URI(p), signer.ECDSAP256); !errors.Is(err, signer.ErrKeyExists) {
		t.Fatalf("second Generate: %v, want ErrKeyExists", err)
	}
	if _, err := b.Import(ctx, URI(p), s1.(*Signer).key); !errors.Is(err, signer.ErrKeyExists) {
		t.Fatalf("Import over key: %v, want ErrKeyExists", err)
	}
	after, _ := os.ReadFile(p)
	if !bytes.Equal(before, after) {
		t.Fatal("key file changed by a refused write")
	}
	s2, err := b.Open(ctx, URI(p))
	if err != nil {
		t.Fatal(err)
	}
	if s1.Describe().Fingerprint != s2.Describe().Fingerprint {
		t.Fatal("reopened key has another fingerprint")
	}
	if !strings.Contains(logs.String(), "process memory") {
		t.Fatalf("no in-memory warning logged: %q", logs.String())
	}
	if strings.Contains(logs.String(), "PRIVATE KEY") {
		t.Fatal("key material logged")
	}
}

func TestParseURI(t *testing.T) {
	tests := []struct {
		uri, want string
		ok        bool
	}{
		{"file:/etc/k.pem", "/etc/k.pem", true},
		{"file:///etc/k.pem", "/etc/k.pem", true},
		{"file:///etc/with%20space.pem", "/etc/with space.pem", true},
		{"file:relative.pem", "", false},
		{"file://host/etc/k.pem", "", false},
		{"file:///etc/k.pem?x=1", "", false},
		{"file:///etc/k.pem#f", "", false},
		{"file:///etc/../k.pem", "", false},
		{"tpm:/etc/k.pem", "", false},
		{"/etc/k.pem", "", false},
		{"file:", "", false},
		{"file:///etc/%00", "", false},
	}
	for _, tt := range tests {
		got, err := ParseURI(tt.uri)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseURI(%q) = %q, %v; want %q, ok=%v", tt.uri, got, err, tt.want, tt.ok)
		}
		if err != nil && !errors.Is(err, signer.ErrInvalidURI) {
			t.Errorf("ParseURI(%q) error %v does not wrap ErrInvalidURI", tt.uri, err)
		}
	}
}

func FuzzParseURI(f *testing.F) {
	for _, s := range []string{"file:/a", "file:///a/b", "file://h/a", "file:a", "file:///a?b#c", "file:///%2e%2e/a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseURI(s)
		if err != nil {
			return
		}
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			t.Fatalf("ParseURI(%q) accepted non-canonical path %q", s, p)
		}
		again, err := ParseURI(URI(p))
		if err != nil || again != p {
			t.Fatalf("round trip of %q: %q, %v", p, again, err)
		}
	})
}

// TestWarningNamesTheKeysRole: the in-memory warning says which key it is
// about — the OS CA, an intermediate, a policy authority — from the
// context it was opened with, "CA" when that says nothing.
func TestWarningNamesTheKeysRole(t *testing.T) {
	p := filepath.Join(t.TempDir(), "k")
	if _, err := (&Backend{}).Generate(context.Background(), URI(p), signer.ECDSAP256); err != nil {
		t.Fatal(err)
	}
	pemKey, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		role signer.KeyRole
		want string
	}{
		{signer.RoleOSCA, "the OS CA private key"},
		{signer.RoleIntermediate, "the intermediate CA private key"},
		{signer.RoleAuthority, "the policy authority private key"},
		{"", "the CA private key"},
	}
	for _, tt := range tests {
		var logs bytes.Buffer
		b := &Backend{Logger: slog.New(slog.NewTextHandler(&logs, nil))}
		ctx := context.Background()
		if tt.role != "" {
			ctx = signer.WithKeyRole(ctx, tt.role)
		}
		if _, err := b.Open(ctx, URI(p)); err != nil {
			t.Fatal(err)
		}
		if _, err := b.FromPEM(ctx, pemKey, "$TRUSTD_OS_CA_KEY"); err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(logs.String(), tt.want+" is held in process memory"); n != 2 {
			t.Errorf("role %q: %d warnings naming it, want 2 (Open, FromPEM): %s", tt.role, n, logs.String())
		}
	}
}
