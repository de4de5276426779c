package main

import (
	"context"
	"crypto/rand"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/keystore"
)

// TestAnchorServesTalosWorkers: the yardstick server issues certificates
// the load tool's workers accept (chain, EKU), and refuses a wrong token.
func TestAnchorServesTalosWorkers(t *testing.T) {
	dir := t.TempDir()
	files, err := keystore.GenerateCredentials(keystore.CredentialsOptions{Cluster: "anchor", Hosts: []string{"127.0.0.1"}, Now: time.Now(), Rand: rand.Reader})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.Name), f.Data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveAnchor(ctx, ln, dir, io.Discard) }()
	defer func() { cancel(); <-done }()
	o := options{addr: ln.Addr().String(), certs: dir, workers: 2, requests: 4, duration: time.Minute, keyType: "p256", reqTimeout: 10 * time.Second}
	res, err := runLoad(o, io.Discard)
	if err != nil || res.issued != 4 {
		t.Fatalf("issued %d of 4: %v %v", res.issued, err, res.codes)
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("wrong"), 0o600); err != nil {
		t.Fatal(err)
	}
	if res, err := runLoad(o, io.Discard); err != nil || res.issued != 0 {
		t.Fatalf("wrong token: issued %d, %v", res.issued, err)
	}
}
