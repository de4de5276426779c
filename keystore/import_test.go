package keystore_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/file"
)

// talosSecrets is a `talosctl gen secrets` output: the machinery's own
// test fixture (pkg/machinery/config/generate/secrets/testdata/secrets.yaml
// of Talos v1.14.1, MPL-2.0), whose trustd token is oamejv.9tk1nhuwnlc2nghf.
func talosSecrets(t *testing.T) ([]byte, string) {
	t.Helper()
	data, err := os.ReadFile("testdata/talos-secrets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return data, "oamejv.9tk1nhuwnlc2nghf"
}

func TestParseTalosSecrets(t *testing.T) {
	data, token := talosSecrets(t)
	src, err := keystore.ParseTalosSecrets(data)
	if err != nil {
		t.Fatal(err)
	}
	if src.Token != token {
		t.Errorf("token %q, want %q", src.Token, token)
	}
	if _, ok := src.Key.(ed25519.PrivateKey); !ok {
		t.Errorf("Talos's OS CA key is %T, want Ed25519", src.Key)
	}
	if !pki.KeyMatchesCert(src.Key.Public(), src.Cert) {
		t.Error("key and certificate do not match")
	}
	for _, bad := range []string{"", "certs: {}", "certs: {os: {crt: '!!', key: 'eA=='}}", "- a list"} {
		if _, err := keystore.ParseTalosSecrets([]byte(bad)); err == nil {
			t.Errorf("ParseTalosSecrets(%q) accepted", bad)
		}
	}
}

func TestImport(t *testing.T) {
	ctx := context.Background()
	secretsYAML, clusterToken := talosSecrets(t)
	talosSrc, err := keystore.ParseTalosSecrets(secretsYAML)
	if err != nil {
		t.Fatal(err)
	}
	// A P-256 CA made by gencreds, and a second one to mismatch with.
	mk := func() *keystore.ImportSource {
		files, err := keystore.GenerateCredentials(keystore.CredentialsOptions{Cluster: "c", Now: testNow, Rand: rand.Reader})
		if err != nil {
			t.Fatal(err)
		}
		var key, crt []byte
		for _, f := range files {
			switch f.Name {
			case certdir.FileCAKey:
				key = f.Data
			case certdir.FileCACert:
				crt = f.Data
			}
		}
		src, err := keystore.ParseImportFiles(key, crt)
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	p256, other := mk(), mk()
	server, _ := keystore.GenerateCredentials(keystore.CredentialsOptions{Cluster: "c", Now: testNow, Rand: rand.Reader})
	var leafKey, leafCrt []byte
	for _, f := range server {
		switch f.Name {
		case certdir.FileServerKey:
			leafKey = f.Data
		case certdir.FileServerCert:
			leafCrt = f.Data
		}
	}
	leaf, err := keystore.ParseImportFiles(leafKey, leafCrt)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		uri     func(root string) string
		src     *keystore.ImportSource
		wantErr error
		wantMsg string
		token   string
	}{
		{"p256 pair", fileURI, p256, nil, "", ""},
		{"talos secrets keep the token", fileURI, talosSrc, nil, "", clusterToken},
		{"mismatched pair", fileURI, &keystore.ImportSource{Key: p256.Key, Cert: other.Cert}, nil, "not a pair", ""},
		{"not a CA", fileURI, leaf, nil, "not a CA certificate", ""},
		// The TPM backend refuses Ed25519 itself, with the way out, before
		// it opens a device.
		{"ed25519 into a TPM", func(string) string { return "tpm:path=/nonexistent/ca.tpmkey" }, talosSrc, signer.ErrUnsupportedAlgorithm, "PKCS#11 HSM that supports CKM_EDDSA", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCeremony(t)
			root := t.TempDir()
			d := keystore.OSDir{Root: filepath.Join(root, "ceremony")}
			res, err := c.Import(ctx, d, keystore.ImportOptions{SignerURI: tt.uri(root), Source: tt.src})
			if tt.wantErr != nil || tt.wantMsg != "" {
				if err == nil || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) || !strings.Contains(err.Error(), tt.wantMsg) {
					t.Fatalf("err = %v, want %v %q", err, tt.wantErr, tt.wantMsg)
				}
				if files := listDir(t, root); len(files) != 0 {
					t.Errorf("files written on failure: %v", files)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(strings.Join(res.Notes, "\n"), "destroy") {
				t.Error("no instruction to destroy the source")
			}
			s, err := c.OpenCA(ctx, tt.uri(root), tt.src.Cert)
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
			if !mustCA(t, d, certdir.FileCACert).Equal(tt.src.Cert) {
				t.Error("os-ca.crt is not the imported CA")
			}
			tok, _ := os.ReadFile(d.Path(certdir.FileToken))
			if tt.token != "" && string(tok) != tt.token {
				t.Errorf("token %q, want the cluster's %q", tok, tt.token)
			}
			// Importing again is recognised as done, not a second key.
			if _, err := c.Import(ctx, d, keystore.ImportOptions{SignerURI: tt.uri(root), Source: tt.src}); err != nil {
				t.Errorf("re-import: %v", err)
			}
			// Another key at the same place is refused.
			if _, err := c.Import(ctx, d, keystore.ImportOptions{SignerURI: tt.uri(root), Source: other, Force: true}); !errors.Is(err, signer.ErrKeyExists) {
				t.Errorf("import over another key: %v", err)
			}
		})
	}
}

func fileURI(root string) string { return file.URI(filepath.Join(root, "ca.key")) }
