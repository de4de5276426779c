package talos

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	stdx509 "crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11/softhsm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// deviceDaemon is a daemon whose CA was made by `ceremony init` on a device.
type deviceDaemon struct {
	*daemon
	token  string
	caPEM  []byte
	health string
}

// startOnDevice runs the key ceremony for uri (env is passed to the
// ceremony and the daemon, e.g. SOFTHSM2_CONF) and starts the daemon on
// the resulting directory, with no serving certificate on disk: the daemon
// issues its own through the device.
func startOnDevice(t testing.TB, uri string, env ...string) *deviceDaemon {
	t.Helper()
	out := filepath.Join(t.TempDir(), "ceremony")
	ceremony(t, env, "init", "--signer", uri, "--cluster", "e2e", "--out", out)
	health := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	d := startDaemon(t, append([]string{
		"TRUSTD_CERT_DIR=" + out,
		"TRUSTD_SIGNER=" + uri,
		"TRUSTD_HEALTH_ADDR=" + health,
		"TRUSTD_READY_WINDOW=2s",
		"TRUSTD_PEER_RATE=-1",
	}, env...)...)
	return &deviceDaemon{
		daemon: d,
		token:  strings.TrimSpace(string(readFile(t, filepath.Join(out, certdir.FileToken)))),
		caPEM:  readFile(t, filepath.Join(out, certdir.FileCACert)),
		health: "http://" + health,
	}
}

// talosWorkers runs Talos's own worker client, both CSR generations.
func (d *deviceDaemon) talosWorkers(t *testing.T) {
	t.Helper()
	for _, m := range []workerCSR{csrFromCA, csrEd25519} {
		ca, crt, id, err := workerRequest(t, d.Addr, d.token, d.caPEM, m, 30*time.Second)
		if err != nil {
			t.Fatalf("worker request (mode %d): %v\n%s", m, err, d.Logs())
		}
		checkIssued(t, ca, crt, id, [][]byte{d.caPEM})
	}
}

// client is a plain SecurityService client for checking exact codes
// (RemoteGenerator retries and wraps them).
func (d *deviceDaemon) client(t testing.TB) securityapi.SecurityServiceClient {
	t.Helper()
	roots := stdx509.NewCertPool()
	roots.AppendCertsFromPEM(d.caPEM)
	conn, err := grpc.NewClient(d.Addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return securityapi.NewSecurityServiceClient(conn)
}

func (d *deviceDaemon) request(c securityapi.SecurityServiceClient) codes.Code {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := stdx509.CreateCertificateRequest(rand.Reader, &stdx509.CertificateRequest{
		Subject: pkix.Name{CommonName: "w"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}, key)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "token", d.token)
	_, err := c.Certificate(ctx, &securityapi.CertificateRequest{Csr: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})})
	return status.Code(err)
}

// TestTPMBackend: the OS CA key made in swtpm by the ceremony, the daemon
// signing through it for Talos's worker client; a PCR change makes it
// answer Unavailable and not ready, a TPM reset (PCRs back) and a TPM
// crash both recover without restarting the daemon.
func TestTPMBackend(t *testing.T) {
	devtest.NeedTool(t, "swtpm")
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	blob := filepath.Join(t.TempDir(), "os-ca.tpmkey")
	uri := "tpm:path=" + blob + ";" + sw.URIAttrs() + ";pcrs=7;timeout=5s"
	d := startOnDevice(t, uri)
	if !strings.Contains(d.Logs(), `"backend":"tpm"`) || !strings.Contains(d.Logs(), `"extractable":false`) {
		t.Fatalf("daemon did not open the TPM key\n%s", d.Logs())
	}
	blobBytes := readFile(t, blob)
	if strings.Contains(string(blobBytes), "PRIVATE KEY-----") && !strings.Contains(string(blobBytes), "TSS2 PRIVATE KEY") {
		t.Fatal("key blob looks like a clear private key")
	}
	t.Run("talos worker", d.talosWorkers)

	c := d.client(t)
	t.Run("pcr policy", func(t *testing.T) { tpmPCRPolicy(t, d, sw, c) })
	t.Run("tpm killed under load", func(t *testing.T) { tpmKilledUnderLoad(t, d, sw, c) })
}

// tpmPCRPolicy: a PCR change makes d answer Unavailable, not ready, with
// one log line of kind policy; a TPM reset (PCRs back) recovers it.
func tpmPCRPolicy(t *testing.T, d *deviceDaemon, sw *tpmsim.Swtpm, c securityapi.SecurityServiceClient) {
	sw.ExtendPCR(t, 7, []byte("boot changed"))
	if code := d.request(c); code != codes.Unavailable {
		t.Fatalf("after PCR extend: %v, want Unavailable", code)
	}
	eventually(t, 10*time.Second, "readyz 503 after PCR change", func() bool { return get(d.health+"/readyz") == 503 })
	if n := strings.Count(d.Logs(), `"msg":"signer failing"`); n != 1 {
		t.Fatalf("signer failure logged %d times, want once", n)
	}
	if !strings.Contains(d.Logs(), `"kind":"policy"`) {
		t.Fatalf("failure not classified as a policy failure\n%s", d.Logs())
	}
	sw.Restart(t) // PCRs reset to their boot values
	eventually(t, 30*time.Second, "issuance after TPM reset", func() bool { return d.request(c) == codes.OK })
	eventually(t, 10*time.Second, "readyz 200 after TPM reset", func() bool { return get(d.health+"/readyz") == 200 })
}

// tpmKilledUnderLoad: with the TPM killed under 4 clients, d answers only
// Unavailable or ResourceExhausted, turns not ready, and recovers by
// itself when the TPM is back.
func tpmKilledUnderLoad(t *testing.T, d *deviceDaemon, sw *tpmsim.Swtpm, c securityapi.SecurityServiceClient) {
	stop := make(chan struct{})
	var mu sync.Mutex
	seen := map[codes.Code]int{}
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				code := d.request(c)
				mu.Lock()
				seen[code]++
				mu.Unlock()
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	sw.Kill()
	time.Sleep(time.Second)
	eventually(t, 10*time.Second, "readyz 503 with the TPM gone", func() bool { return get(d.health+"/readyz") == 503 })
	sw.Restart(t)
	eventually(t, 30*time.Second, "issuance after TPM restart", func() bool { return d.request(c) == codes.OK })
	close(stop)
	wg.Wait()
	for code, n := range seen {
		if code != codes.OK && code != codes.Unavailable && code != codes.ResourceExhausted {
			t.Errorf("%d answers with %v while the TPM was down; want only Unavailable/ResourceExhausted", n, code)
		}
	}
	if seen[codes.Unavailable] == 0 {
		t.Errorf("no Unavailable while the TPM was down: %v", seen)
	}
	eventually(t, 10*time.Second, "readyz 200 after TPM restart", func() bool { return get(d.health+"/readyz") == 200 })
	if d.Exited() {
		t.Fatal("daemon exited")
	}
}

// TestPKCS11Backend: the OS CA key generated on a SoftHSMv2 token by the
// ceremony; Talos's worker client, 8 concurrent clients, and recovery
// after the token disappears and comes back.
func TestPKCS11Backend(t *testing.T) {
	devtest.NeedTool(t, "softhsm2-util")
	tok, err := softhsm.New(t.TempDir(), "trustd")
	if err != nil {
		t.Fatal(err)
	}
	uri := tok.URI("os-ca", []byte{1})
	d := startOnDevice(t, uri, tok.Env())
	if strings.Contains(d.Logs(), tok.PIN) {
		t.Fatal("PIN in the daemon's log")
	}
	if !strings.Contains(d.Logs(), `"backend":"pkcs11"`) || !strings.Contains(d.Logs(), `"extractable":false`) {
		t.Fatalf("daemon did not open the HSM key as non-extractable\n%s", d.Logs())
	}
	t.Run("talos worker", d.talosWorkers)
	t.Run("8 concurrent clients", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := d.client(t)
				for j := 0; j < 10; j++ {
					if code := d.request(c); code != codes.OK {
						errs <- fmt.Errorf("request: %v", code)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
	t.Run("token removed and restored", func(t *testing.T) {
		if err := tok.Remove(); err != nil {
			t.Fatal(err)
		}
		d.lostAndBack(t, tok.Restore)
	})
}
