package main

import (
	"context"
	"crypto/rand"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/internal/issuelog"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/file"
)

// logDaemon is a cert dir, a log key and log.pub as log init leaves them.
type logDaemon struct {
	certDir, logDir, logKey, vkey string
	caPEM                         []byte
	ca                            signer.Signer
}

func newLogDaemon(t *testing.T) logDaemon {
	t.Helper()
	dir := t.TempDir()
	d := logDaemon{certDir: filepath.Join(dir, "certs"), logDir: filepath.Join(dir, "log"), logKey: file.URI(filepath.Join(dir, "log.key"))}
	os.MkdirAll(d.certDir, 0o700)
	os.MkdirAll(d.logDir, 0o700)
	var err error
	if d.ca, err = (&file.Backend{}).Generate(context.Background(), file.URI(filepath.Join(d.certDir, "os-ca.key")), signer.ECDSAP256); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.NewCACertificate(d.ca, pki.CAOptions{Cluster: "t"}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	d.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	os.WriteFile(filepath.Join(d.certDir, "os-ca.crt"), d.caPEM, 0o600)
	os.WriteFile(filepath.Join(d.certDir, "token"), []byte("tok-1\n"), 0o600)
	lk, err := (&file.Backend{}).Generate(context.Background(), d.logKey, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := issuelog.NewNoteSigner("steward-trustd.test/a", lk)
	if err != nil {
		t.Fatal(err)
	}
	d.vkey = ns.Verifier()
	os.WriteFile(filepath.Join(d.logDir, issuelog.FileVerifier), []byte(d.vkey+"\n"), 0o644)
	return d
}

func (d logDaemon) config(t *testing.T, extra map[string]string) (*config, error) {
	t.Helper()
	vals := map[string]string{"cert-dir": d.certDir, "listen-address": "127.0.0.1", "cert-sans": "127.0.0.1", "health-addr": "127.0.0.1:0",
		"log-dir": d.logDir, "log-key": d.logKey, "log-checkpoint-interval": "100ms"}
	for k, v := range extra {
		vals[k] = v
	}
	cfg, err := loadConfig(func(name string) (string, bool) { v, ok := vals[name]; return v, ok })
	if cfg != nil {
		cfg.listen = "127.0.0.1:0"
	}
	return cfg, err
}

// TestDaemonLogsEveryCertificate: with TRUSTD_LOG_DIR set the log is
// required by default; every certificate workers got is in it, the log
// is served on the health port and verifies under log.pub.
func TestDaemonLogsEveryCertificate(t *testing.T) {
	d := newLogDaemon(t)
	cfg, err := d.config(t, nil)
	if err != nil || cfg.logMode != logRequired {
		t.Fatalf("%v %v", err, cfg)
	}
	logs := &devtest.LockedBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveWith(ctx, cfg, d.ca, slog.New(slog.NewJSONHandler(logs, nil))) }()
	addr := listeningAddress(t, logs, "steward-trustd listening")
	health := listeningAddress(t, logs, "health and metrics listening")
	for range 3 {
		if err := request(t, addr, d.caPEM, "tok-1"); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond) // a checkpoint interval
	resp, err := http.Get("http://" + health + "/log/checkpoint")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if cp, err := issuelog.ParseCheckpoint(body, d.vkey); err != nil || cp.Size != 4 {
		t.Fatalf("served checkpoint %q: %v", body, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	snap, err := issuelog.ReadDir(d.logDir)
	if err != nil {
		t.Fatal(err)
	}
	// three workers' certificates and the self-issued serving certificate
	if r, err := issuelog.Verify(snap, d.vkey); err != nil || !r.OK() || r.Issued != 4 {
		t.Fatalf("%v %+v", err, r)
	}
	if first, _ := issuelog.ParseEntry(snap.Entries[0]); first.Kind != "serving" {
		t.Errorf("first entry %+v, want the serving certificate", first)
	}
}

// TestLogConfigRefusals: a required log without key, the CA key as log
// key, a wrong key, and an unwritable directory stop the start with one
// line.
func TestLogConfigRefusals(t *testing.T) {
	d := newLogDaemon(t)
	if _, err := d.config(t, map[string]string{"log-key": ""}); err == nil || !strings.Contains(err.Error(), "TRUSTD_LOG_KEY") {
		t.Errorf("no key: %v", err)
	}
	caURI := file.URI(filepath.Join(d.certDir, "os-ca.key"))
	if _, err := d.config(t, map[string]string{"log-key": caURI, "signer": caURI}); err == nil || !strings.Contains(err.Error(), "OS CA key") {
		t.Errorf("CA key as log key: %v", err)
	}
	if cfg, err := d.config(t, map[string]string{"log": "off"}); err != nil || cfg.logMode != logOff {
		t.Errorf("explicit off: %v", err)
	}
	cfg, _ := d.config(t, map[string]string{"log-key": caURI})
	if _, err := newDaemon(cfg, d.ca, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "not the key log.pub pins") {
		t.Errorf("another key: %v", err)
	}
	os.Remove(filepath.Join(d.logDir, issuelog.FileVerifier))
	os.WriteFile(filepath.Join(d.logDir, issuelog.FileVerifier), []byte(d.vkey), 0o644)
	os.WriteFile(filepath.Join(d.logDir, issuelog.DirCheckpoints), nil, 0o644) // a file where the log writes a directory
	cfg, _ = d.config(t, nil)
	_, err := newDaemon(cfg, d.ca, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "not writable") || strings.Contains(err.Error(), "\n") {
		t.Errorf("unwritable log directory: %v", err)
	}
}
