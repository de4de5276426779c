// Package ceremony_test runs steward-trustd-ceremony end to end, as a
// binary, against the file backend, SoftHSMv2 and swtpm, with the
// steward-trustd daemon serving the ceremony's output directory.
package ceremony_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/apidtest"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/internal/doctor"
	"github.com/steward-trustd/steward-trustd/internal/workerclient"
)

// binDir holds the binaries built once by TestMain.
var binDir string

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	dir, err := devtest.BuildBinaries(filepath.Join("..", ".."), "./cmd/steward-trustd", "./cmd/steward-trustd-ceremony", "./cmd/steward-trustd-gencreds")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	if err := buildCrashBinary(filepath.Join("..", ".."), filepath.Join(dir, "crash")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// buildCrashBinary builds steward-trustd-ceremony with the
// steward_crashpoints tag into dir: the only build that honours
// crashpoint.EnvKillAt.
func buildCrashBinary(root, dir string) error {
	build := exec.Command("go", "build", "-tags", "steward_crashpoints", "-o", dir+string(filepath.Separator), "./cmd/steward-trustd-ceremony")
	build.Dir = root
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build the crash-point ceremony binary: %w", err)
	}
	return nil
}

// result is one ceremony run.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// ceremony runs steward-trustd-ceremony with env added to a clean
// environment.
func ceremony(t *testing.T, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "steward-trustd-ceremony"), args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{code, out.String(), errb.String()}
}

// mustCeremony runs the ceremony and fails the test unless it exits 0.
func mustCeremony(t *testing.T, env []string, args ...string) result {
	t.Helper()
	r := ceremony(t, env, args...)
	if r.code != 0 {
		t.Fatalf("steward-trustd-ceremony %s: %s", strings.Join(args, " "), r)
	}
	return r
}

// daemon is a running steward-trustd.
type daemon = devtest.Daemon

// startDaemon runs steward-trustd on a free loopback port serving certDir
// with the key at signerURI, and waits until it listens.
func startDaemon(t *testing.T, certDir, signerURI string, env ...string) *daemon {
	t.Helper()
	return devtest.StartDaemon(t, filepath.Join(binDir, "steward-trustd"),
		append([]string{"TRUSTD_CERT_DIR=" + certDir, "TRUSTD_SIGNER=" + signerURI}, env...)...)
}

// workerRequest asks the daemon for a certificate exactly as a worker
// does (internal/workerclient: TLS verified against the worker config's
// CAs, token metadata, a fresh P-256 key and CSR for 127.0.0.1) and
// returns the checked answer and the key.
func workerRequest(t *testing.T, addr string, wc *doctor.WorkerConfig) (*workerclient.Response, crypto.Signer, error) {
	t.Helper()
	key, csr, err := workerclient.NewCSR(rand.Reader, workerclient.KeyP256, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "worker", Organization: []string{"os:server"}}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := workerclient.Dial(addr, workerclient.TLSConfig(workerclient.Roots(append([]*x509.Certificate{wc.CA}, wc.AcceptedCAs...)...), "127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := workerclient.Request(ctx, cc, wc.Token, csr)
	return resp, key, err
}

// workerCertificate is workerRequest that must succeed: it returns the
// `ca` bundle and a serving certificate for 127.0.0.1 that an apid-like
// server can use.
func workerCertificate(t *testing.T, addr string, wc *doctor.WorkerConfig) ([]*x509.Certificate, tls.Certificate) {
	t.Helper()
	resp, key, err := workerRequest(t, addr, wc)
	if err != nil {
		t.Fatalf("worker certificate request: %v", err)
	}
	// apid loads `crt` whole with tls.X509KeyPair: the leaf and, in the
	// tiered setup, the issuer chain after it.
	serving, err := tls.X509KeyPair(resp.CertPEM, pemKey(t, key))
	if err != nil {
		t.Fatalf("returned crt: %v", err)
	}
	return resp.Bundle, serving
}

// apid starts an apid-like server the way a worker runs it after asking
// the daemon: serving with the daemon-issued certificate, client CAs =
// the returned bundle.
func apid(t *testing.T, d *daemon, wc *doctor.WorkerConfig) (*apidtest.Server, int) {
	t.Helper()
	bundle, serving := workerCertificate(t, d.Addr, wc)
	srv, err := apidtest.Start(serving, bundle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv, len(bundle)
}

func workerConfig(t *testing.T, path string) *doctor.WorkerConfig {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	wc, err := doctor.ParseWorkerConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	return wc
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func pemKey(t *testing.T, key crypto.Signer) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// writeCSR writes a PEM CSR for a fresh P-256 key.
func writeCSR(t *testing.T, path, cn string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn}}, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
