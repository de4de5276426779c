package main

import (
	"context"
	"crypto"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/file"
)

// closeTracker holds every Sign until released and records Close, failing
// a Sign that comes after it.
type closeTracker struct {
	signer.Signer
	t       *testing.T
	entered chan struct{}
	release chan struct{}
	hold    bool

	mu     sync.Mutex
	closed int
}

func (c *closeTracker) Sign(r io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	c.mu.Lock()
	hold, closed := c.hold, c.closed
	c.mu.Unlock()
	if closed > 0 {
		c.t.Error("Sign after Close")
	}
	if hold {
		c.entered <- struct{}{}
		<-c.release
	}
	return c.Signer.Sign(r, d, o)
}

func (c *closeTracker) Close() error {
	c.mu.Lock()
	c.closed++
	c.mu.Unlock()
	return c.Signer.Close()
}

// TestShutdownFinishesRequestsThenClosesSigner: a request in flight when
// SIGTERM comes still gets its certificate, and the signer is closed once,
// after every part of the daemon has stopped.
func TestShutdownFinishesRequestsThenClosesSigner(t *testing.T) {
	dir := t.TempDir()
	keyURI := file.URI(filepath.Join(dir, "os-ca.key"))
	s, err := (&file.Backend{}).Generate(context.Background(), keyURI, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.NewCACertificate(s, pki.CAOptions{Cluster: "t"}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	for name, b := range map[string][]byte{"os-ca.crt": caPEM, "token": []byte("tok-1\ntok-2\n")} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := loadConfig(func(name string) (string, bool) {
		v, ok := map[string]string{"cert-dir": dir, "listen-address": "127.0.0.1", "port": "1", "cert-sans": "127.0.0.1", "health-addr": "127.0.0.1:0"}[name]
		return v, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.listen = "127.0.0.1:0"
	tracker := &closeTracker{Signer: s, t: t, entered: make(chan struct{}, 1), release: make(chan struct{})}
	logs := &devtest.LockedBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveWith(ctx, cfg, tracker, slog.New(slog.NewJSONHandler(logs, nil))) }()
	addr := listeningAddress(t, logs, "steward-trustd listening")
	// Ready: the start-up probe signature is done, the next one is 15 s
	// away, so the held signature below is the request's.
	health := listeningAddress(t, logs, "health and metrics listening")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get("http://" + health + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("daemon not ready within 10s")
		}
	}

	tracker.mu.Lock()
	tracker.hold = true
	tracker.mu.Unlock()
	answer := make(chan error, 1)
	go func() { answer <- request(t, addr, caPEM, "tok-2") }()
	<-tracker.entered
	cancel() // SIGTERM with a request in flight
	time.Sleep(200 * time.Millisecond)
	tracker.mu.Lock()
	if tracker.closed != 0 {
		t.Error("signer closed while a request was in flight")
	}
	tracker.mu.Unlock()
	close(tracker.release)
	if err := <-answer; err != nil {
		t.Fatalf("request in flight at shutdown: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if tracker.closed != 1 {
		t.Fatalf("signer closed %d times, want once", tracker.closed)
	}
}

func listeningAddress(t *testing.T, logs *devtest.LockedBuffer, msg string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(logs.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
				return m["address"].(string)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("daemon not listening:\n%s", logs.String())
	return ""
}

func request(t *testing.T, addr string, caPEM []byte, token string) error {
	t.Helper()
	_, err := requestCert(addr, caPEM, token)
	return err
}

// TestSignerRole: the daemon's key is an intermediate when an issuer chain
// is configured or lies in the cert dir, else the OS CA; a file key's
// warning names it so.
func TestSignerRole(t *testing.T) {
	withChain := t.TempDir()
	if err := os.WriteFile(filepath.Join(withChain, certdir.FileIssuerChain), []byte("chain"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  config
		want signer.KeyRole
	}{
		{"single tier", config{certDir: t.TempDir()}, signer.RoleOSCA},
		{"issuer.crt in the cert dir", config{certDir: withChain}, signer.RoleIntermediate},
		{"inline chain", config{certDir: t.TempDir(), issuer: []byte("chain")}, signer.RoleIntermediate},
		{"chain file", config{certDir: t.TempDir(), issuerFile: "/n/a.crt"}, signer.RoleIntermediate},
	}
	for _, tt := range tests {
		if got := tt.cfg.signerRole(); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}
