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
	p256 := generatedPair(t, certdir.FileCAKey, certdir.FileCACert)
	other := generatedPair(t, certdir.FileCAKey, certdir.FileCACert)
	leaf := generatedPair(t, certdir.FileServerKey, certdir.FileServerCert)

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
			uri := tt.uri(root)
			res, err := c.Import(ctx, d, keystore.ImportOptions{SignerURI: uri, Source: tt.src})
			if tt.wantErr != nil || tt.wantMsg != "" {
				checkImportRefused(t, err, tt.wantErr, tt.wantMsg, root)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkImported(t, c, d, uri, tt.src, res, tt.token)
			// Importing again is recognised as done, not a second key.
			if _, err := c.Import(ctx, d, keystore.ImportOptions{SignerURI: uri, Source: tt.src}); err != nil {
				t.Errorf("re-import: %v", err)
			}
			// Another key at the same place is refused.
			if _, err := c.Import(ctx, d, keystore.ImportOptions{SignerURI: uri, Source: other, Force: true}); !errors.Is(err, signer.ErrKeyExists) {
				t.Errorf("import over another key: %v", err)
			}
		})
	}
}

// generatedPair returns the key and certificate named keyName and
// certName of a fresh gencreds output, as an import source.
func generatedPair(t *testing.T, keyName, certName string) *keystore.ImportSource {
	t.Helper()
	files, err := keystore.GenerateCredentials(keystore.CredentialsOptions{Cluster: "c", Now: testNow, Rand: rand.Reader})
	if err != nil {
		t.Fatal(err)
	}
	var key, crt []byte
	for _, f := range files {
		switch f.Name {
		case keyName:
			key = f.Data
		case certName:
			crt = f.Data
		}
	}
	src, err := keystore.ParseImportFiles(key, crt)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// checkImportRefused checks that err is the wanted refusal (wrapping
// wantErr if set, mentioning wantMsg) and that nothing was written under
// root.
func checkImportRefused(t *testing.T, err, wantErr error, wantMsg, root string) {
	t.Helper()
	if err == nil || (wantErr != nil && !errors.Is(err, wantErr)) || !strings.Contains(err.Error(), wantMsg) {
		t.Fatalf("err = %v, want %v %q", err, wantErr, wantMsg)
	}
	if files := listDir(t, root); len(files) != 0 {
		t.Errorf("files written on failure: %v", files)
	}
}

// checkImported checks that the import of src to uri tells to destroy the
// source, that the key opens as the CA's, that d holds the CA and, if
// token is set, that token.
func checkImported(t *testing.T, c *keystore.Ceremony, d keystore.Dir, uri string, src *keystore.ImportSource, res *keystore.Outcome, token string) {
	t.Helper()
	notes := strings.Join(res.Notes, "\n")
	if !strings.Contains(notes, "destroy") {
		t.Error("no instruction to destroy the source")
	}
	// A file key is no device: the note must not claim one.
	if strings.HasPrefix(uri, "file:") && (strings.Contains(notes, "on the device") || !strings.Contains(notes, "key file")) {
		t.Errorf("file-key import notes claim a device: %s", notes)
	}
	s, err := c.OpenCA(context.Background(), uri, src.Cert)
	if err != nil {
		t.Fatal(err)
	}
	checkClose(t, s)
	if !mustCA(t, d, certdir.FileCACert).Equal(src.Cert) {
		t.Error("os-ca.crt is not the imported CA")
	}
	tok, _ := os.ReadFile(d.Path(certdir.FileToken))
	if token != "" && string(tok) != token+"\n" {
		t.Errorf("token %q, want the cluster's %q", tok, token)
	}
}

func fileURI(root string) string { return file.URI(filepath.Join(root, "ca.key")) }
