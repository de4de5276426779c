package keystore_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer/file"
)

func selfSignedCA(t *testing.T, name string) *x509.Certificate {
	t.Helper()
	ca, _ := devtest.SelfSignedCA(t, name)
	return ca
}

// statementOf reads d's statement, checked against its os-ca.crt.
func statementOf(t *testing.T, d keystore.Dir) *certdir.TrustStatement {
	t.Helper()
	st, err := certdir.ParseTrustStatement(readFile(t, d.Path(certdir.FileTrustStatement)), mustCA(t, d, certdir.FileCACert))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestTrust: add and remove number their statements one after the
// other, the Secret carries them, a re-run signs nothing, and what
// cannot be vouched for is refused with a reason.
func TestTrust(t *testing.T) {
	c := newCeremony(t)
	ctx := context.Background()
	root := t.TempDir()
	uri, d := initCA(t, c, root)
	rootCA := mustCA(t, d, certdir.FileCACert)
	a, b := selfSignedCA(t, "a"), selfSignedCA(t, "b")
	trust := func(ca *x509.Certificate, remove bool) (*keystore.Outcome, error) {
		return c.Trust(ctx, d, keystore.TrustOptions{SignerURI: uri, Root: rootCA, CA: ca, Remove: remove})
	}
	for i, ca := range []*x509.Certificate{a, b} {
		if _, err := trust(ca, false); err != nil {
			t.Fatal(err)
		}
		if st := statementOf(t, d); st.Sequence != uint64(i+1) || len(st.CAs) != i+1 {
			t.Fatalf("after adding %d CAs: %+v", i+1, st)
		}
	}
	before := readFile(t, d.Path(certdir.FileTrustStatement))
	if res, err := trust(b, false); err != nil || !res.AlreadyDone || string(readFile(t, d.Path(certdir.FileTrustStatement))) != string(before) {
		t.Errorf("re-run: %+v %v", res, err)
	}
	if _, err := trust(a, true); err != nil {
		t.Fatal(err)
	}
	if st := statementOf(t, d); st.Sequence != 3 || st.Vouches(a) || !st.Vouches(b) {
		t.Errorf("after remove: %+v", st)
	}
	var secret struct {
		Data map[string][]byte `json:"data"`
	}
	if err := json.Unmarshal(readFile(t, d.Path(certdir.FileKubernetesSecret)), &secret); err != nil || string(secret.Data[certdir.FileTrustStatement]) != string(readFile(t, d.Path(certdir.FileTrustStatement))) {
		t.Errorf("the Secret does not carry the statement: %v", err)
	}
	if got := receiptOps(t, d); strings.Join(got, " ") != "init.key init trust.add trust.add trust.remove" {
		t.Errorf("receipts %v", got)
	}
	trustRefusals(t, c, d, uri, rootCA)
}

// trustRefusals covers what Trust refuses.
func trustRefusals(t *testing.T, c *keystore.Ceremony, d keystore.OSDir, uri string, rootCA *x509.Certificate) {
	other := file.URI(filepath.Join(t.TempDir(), "other.key"))
	ca := selfSignedCA(t, "c")
	tests := []struct {
		name string
		o    keystore.TrustOptions
		want string
	}{
		{"wrong --ca", keystore.TrustOptions{SignerURI: uri, Root: ca, CA: ca}, "--ca is not"},
		{"the root itself", keystore.TrustOptions{SignerURI: uri, Root: rootCA, CA: rootCA}, "always served"},
		{"another key", keystore.TrustOptions{SignerURI: other, Root: rootCA, CA: ca}, "open CA key"},
	}
	for _, tt := range tests {
		if _, err := c.Trust(context.Background(), d, tt.o); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
	// A statement edited by hand: the ceremony will not number after it.
	path := d.Path(certdir.FileTrustStatement)
	if err := os.WriteFile(path, []byte(`{"statement":"e30=","signature":"AA=="}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Trust(context.Background(), d, keystore.TrustOptions{SignerURI: uri, Root: rootCA, CA: ca}); err == nil || !strings.Contains(err.Error(), "restore the statement") {
		t.Errorf("tampered statement: %v", err)
	}
}

// TestWorkerPatchCarriesNewestToken: Talos sends no request when
// machine.token holds several lines. During a token rotation
// the token file holds two lines (the new one appended by the shell); a
// ceremony command that rewrites the worker patch puts exactly the newest
// (last) into machine.token and keeps both in the token file.
func TestWorkerPatchCarriesNewestToken(t *testing.T) {
	c := newCeremony(t)
	root := t.TempDir()
	uri, d := initCA(t, c, root)
	path := d.Path(certdir.FileToken)
	old := strings.TrimSpace(string(readFile(t, path)))
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	const newer = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if _, err := f.WriteString(newer + "\n"); err != nil { // openssl rand -hex 32 >> token
		t.Fatal(err)
	}
	f.Close()
	if _, err := c.Trust(context.Background(), d, keystore.TrustOptions{SignerURI: uri, Root: mustCA(t, d, certdir.FileCACert), CA: selfSignedCA(t, "x")}); err != nil {
		t.Fatal(err)
	}
	patch := string(readFile(t, d.Path(certdir.FileWorkerPatch)))
	if !strings.Contains(patch, "token: "+newer+"\n") || strings.Contains(patch, old) {
		t.Errorf("worker patch does not carry exactly the newest token:\n%s", patch)
	}
	if got := string(readFile(t, path)); got != old+"\n"+newer+"\n" {
		t.Errorf("token file %q, want both tokens, one per line", got)
	}
	if _, err := keystore.WorkerPatch(old+"\n"+newer, mustCA(t, d, certdir.FileCACert), nil); err == nil {
		t.Error("a worker patch with two tokens was rendered")
	}
}
