package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/issuelog"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer/file"
)

// TestLogCommands: log init creates the log key and log.pub; a log the
// daemon would write verifies, a certificate in it is proven, and a
// tampered entry makes log verify fail naming it.
func TestLogCommands(t *testing.T) {
	dir := t.TempDir()
	logDir := filepath.Join(dir, "log")
	keyURI := file.URI(filepath.Join(dir, "log.key"))
	code, out, errOut := runCmd(t, "log", "init", "--signer", keyURI, "--log", logDir, "--name", "steward-trustd.test/a")
	if code != 0 || !strings.Contains(out, "verifier key") {
		t.Fatalf("log init: %d %s %s", code, out, errOut)
	}
	if code, _, errOut := runCmd(t, "log", "init", "--signer", keyURI, "--log", logDir); code != 1 || !strings.Contains(errOut, "--reuse-key") {
		t.Errorf("a second log init over the key: %d %s", code, errOut)
	}
	certFile := writeLog(t, logDir, keyURI)
	pub := filepath.Join(logDir, issuelog.FileVerifier)
	if code, out, errOut := runCmd(t, "log", "verify", "--log", logDir, "--key", pub); code != 0 || !strings.Contains(out, "1 certificates") {
		t.Fatalf("log verify: %d %s %s", code, out, errOut)
	}
	code, out, errOut = runCmd(t, "log", "prove", "--cert", certFile, "--log", logDir, "--key", pub)
	var in issuelog.Inclusion
	if code != 0 || json.Unmarshal([]byte(out), &in) != nil || in.Check() != nil || in.TreeSize != 3 {
		t.Fatalf("log prove: %d %s %s", code, out, errOut)
	}
	state := filepath.Join(dir, "witness")
	wkey := file.URI(filepath.Join(dir, "witness.key"))
	code, out, errOut = runCmd(t, "log", "witness", "--log", logDir, "--key", pub, "--signer", wkey, "--create", "--name", "steward-trustd.test/b", "--state", state)
	if code != 0 || !strings.Contains(errOut, "witness verifier key") || !strings.Contains(out, "— steward-trustd.test/b ") {
		t.Fatalf("log witness: %d %s %s", code, out, errOut)
	}
	entries := filepath.Join(logDir, issuelog.FileEntries)
	b, _ := os.ReadFile(entries)
	os.WriteFile(entries, []byte(strings.Replace(string(b), `"event":"denied"`, `"event":"deniED"`, 1)), 0o644)
	if code, out, _ := runCmd(t, "log", "verify", "--log", logDir, "--key", pub); code != 1 || !strings.Contains(out, "tampered entry") {
		t.Errorf("a tampered log: %d %s", code, out)
	}
	if code, _, errOut := runCmd(t, "log", "witness", "--log", logDir, "--key", pub, "--signer", wkey, "--name", "steward-trustd.test/b", "--state", state); code != 1 || !strings.Contains(errOut, "tampered entry") {
		t.Errorf("the witness cosigned a tampered log: %d %s", code, errOut)
	}
}

// writeLog appends what the daemon would, through the log key, and
// returns the file of the issued certificate.
func writeLog(t *testing.T, logDir, keyURI string) string {
	t.Helper()
	key, err := (&file.Backend{}).Open(context.Background(), keyURI)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := issuelog.NewNoteSigner("steward-trustd.test/a", key)
	if err != nil {
		t.Fatal(err)
	}
	l, err := issuelog.Open(logDir, issuelog.Options{Signer: ns})
	if err != nil {
		t.Fatal(err)
	}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca, _ := pki.NewCACertificate(caKey, pki.CAOptions{Cluster: "c"}, time.Now(), rand.Reader)
	w := pki.WorkerRequest{Subject: pkix.Name{CommonName: "w"}, DNSNames: []string{"w"}, PublicKey: caKey.Public()}
	cert, err := pki.NewWorkerCertificate(ca, caKey, w, time.Hour, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []issuelog.Entry{{Version: 1, Event: issuelog.EventDenied, Reason: "x"}, issuelog.Issued(time.Now(), "worker", cert.Raw, "1"), {Version: 1, Event: issuelog.EventDenied, Reason: "y"}} {
		b, _ := e.Marshal()
		if _, err := l.Append(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(logDir, "..", "worker.crt")
	os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), 0o644)
	return p
}
