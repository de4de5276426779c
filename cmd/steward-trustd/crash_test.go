package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/internal/issuelog"
	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// TestKill9DuringFleetBoot: 32 workers boot at once and retry like Talos
// workers; the daemon is killed with SIGKILL after a quarter of them got
// their certificate and restarted. Every certificate a worker received is
// in the log (an inclusion proof under the final checkpoint for each),
// the log verifies, and no certificate is in it twice.
func TestKill9DuringFleetBoot(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon")
	}
	bins, err := devtest.BuildBinaries(filepath.Join("..", ".."), "./cmd/steward-trustd")
	if err != nil {
		t.Fatal(err)
	}
	d := newLogDaemon(t)
	env := []string{"TRUSTD_CERT_DIR=" + d.certDir, "TRUSTD_LOG_DIR=" + d.logDir, "TRUSTD_LOG_KEY=" + d.logKey, "TRUSTD_CERT_SANS=127.0.0.1", "TRUSTD_PEER_RATE=-1"}
	start := func() *devtest.Daemon { return devtest.StartDaemon(t, filepath.Join(bins, "steward-trustd"), env...) }
	var addr atomic.Value
	daemon := start()
	addr.Store(daemon.Addr)
	const workers, total = 32, 320
	got := make(chan []byte, total)
	var wg sync.WaitGroup
	var next atomic.Int64
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= total {
				got <- bootWorker(t, &addr, d.caPEM)
			}
		}()
	}
	var received [][]byte
	for len(received) < total {
		received = append(received, <-got)
		if len(received) == total/4 {
			if err := syscall.Kill(daemon.PID(), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			for !daemon.Exited() {
				time.Sleep(10 * time.Millisecond)
			}
			daemon = start()
			addr.Store(daemon.Addr)
		}
	}
	wg.Wait()
	daemon.Stop(t) // signs the final checkpoint
	checkFleetLog(t, d, received)
}

// bootWorker retries until the daemon (at the current address) issues.
func bootWorker(t *testing.T, addr *atomic.Value, caPEM []byte) []byte {
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if der, err := requestCert(addr.Load().(string), caPEM, "tok-1"); err == nil {
			return der
		}
	}
	t.Error("a worker got no certificate within 2 minutes")
	return nil
}

// requestCert asks for a certificate as a worker does (a fresh key, CSR
// and connection) and returns its DER.
func requestCert(addr string, caPEM []byte, token string) ([]byte, error) {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: []string{"w"}}, key)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "token", token), 10*time.Second)
	defer cancel()
	resp, err := securityapi.NewSecurityServiceClient(conn).Certificate(ctx, &securityapi.CertificateRequest{Csr: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})})
	if err != nil {
		return nil, err
	}
	certs, err := pki.ParseCertificates(resp.GetCrt())
	if err != nil {
		return nil, err
	}
	return certs[0].Raw, nil
}

func checkFleetLog(t *testing.T, d logDaemon, received [][]byte) {
	t.Helper()
	snap, err := issuelog.ReadDir(d.logDir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := issuelog.Verify(snap, d.vkey)
	if err != nil || !r.OK() {
		t.Fatalf("log after kill -9: %v %q", err, r.Problems)
	}
	for _, der := range received {
		idx, _, err := issuelog.Find(snap, der)
		if err != nil {
			t.Fatalf("a certificate a worker received is not in the log: %v", err)
		}
		if _, err := issuelog.Prove(snap, idx, r.Latest); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d certificates received, %d in the log (a certificate logged but cut off by the kill is allowed), %d entries, log %d bytes per entry",
		len(received), r.Issued, r.Entries, logBytes(t, d.logDir)/max(r.Entries, 1))
}

func logBytes(t *testing.T, dir string) int64 {
	t.Helper()
	fi, err := os.Stat(filepath.Join(dir, issuelog.FileEntries))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
