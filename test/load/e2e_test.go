package main

import (
	"bytes"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer"
)

// TestAgainstTheDaemon runs the load tool as a user does, against the
// real daemon binary on a file key: every simulated worker of both key
// types gets a certificate that chains to the cert dir's CA.
func TestAgainstTheDaemon(t *testing.T) {
	bin, err := devtest.BuildBinaries(filepath.Join("..", ".."), "./cmd/steward-trustd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bin) })
	certs := t.TempDir()
	files, err := keystore.GenerateCredentials(keystore.CredentialsOptions{Cluster: "load", Algorithm: signer.ECDSAP256, Now: time.Now(), Rand: rand.Reader})
	if err != nil {
		t.Fatal(err)
	}
	if err := keystore.WriteSet(keystore.OSDir{Root: certs}, files, false); err != nil {
		t.Fatal(err)
	}
	d := devtest.StartDaemon(t, filepath.Join(bin, "steward-trustd"), "TRUSTD_CERT_DIR="+certs, "TRUSTD_PEER_RATE=-1",
		"TRUSTD_SIGNER=file:"+filepath.Join(certs, certdir.FileCAKey))
	for _, extra := range [][]string{
		{"-key", "p256"},
		{"-key", "ed25519", "-ramp", "300ms", "-reuse"},
		{"-spread-sources", "-retry"},
		{"-light"},
	} {
		var out bytes.Buffer
		args := append([]string{"-addr", d.Addr, "-certs", certs, "-workers", "2", "-requests", "6", "-duration", "1m"}, extra...)
		code := run(args, &out, io.Discard)
		if code != 0 || !strings.Contains(out.String(), "certificates: 6/6") || !strings.Contains(out.String(), "errors by code: none") {
			t.Errorf("%v: exit %d\n%s\n%s", extra, code, out.String(), d.Logs())
		}
	}
	var bound bytes.Buffer
	if code := run([]string{"-cpu-bound", "-certs", certs, "-requests", "20"}, &bound, io.Discard); code != 0 || !strings.Contains(bound.String(), "local CPU bound: 20 certificates") {
		t.Errorf("-cpu-bound: exit %d\n%s", code, bound.String())
	}
	// A worker with a wrong token: counted by gRPC code, and the run fails.
	wrong := t.TempDir()
	ca, err := os.ReadFile(filepath.Join(certs, certdir.FileCACert))
	if err != nil {
		t.Fatal(err)
	}
	for n, b := range map[string][]byte{certdir.FileCACert: ca, certdir.FileToken: []byte("wrong")} {
		if err := os.WriteFile(filepath.Join(wrong, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if code := run([]string{"-addr", d.Addr, "-certs", wrong, "-workers", "1", "-requests", "2"}, &out, io.Discard); code != 1 || !strings.Contains(out.String(), "Unauthenticated=2") {
		t.Errorf("wrong token: exit %d\n%s", code, out.String())
	}
	// The daemon also rate-limits the wrong token (ResourceExhausted).
	out.Reset()
	if code := run([]string{"-light", "-addr", d.Addr, "-certs", wrong, "-workers", "2", "-requests", "4"}, &out, io.Discard); code != 1 || !strings.Contains(out.String(), "certificates: 0/4") || !strings.Contains(out.String(), "Unauthenticated=") {
		t.Errorf("-light, wrong token: exit %d\n%s", code, out.String())
	}
}
