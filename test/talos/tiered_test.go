package talos

import (
	"crypto/tls"
	stdx509 "crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	talosx509 "github.com/siderolabs/crypto/x509"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11/softhsm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// tieredDevice makes one node's signing device; kill (nil for file:)
// takes it away from the running daemon.
type tieredDevice func(t *testing.T, dir string) (uri string, env []string, kill func())

var tieredDevices = map[string]tieredDevice{
	"file": func(_ *testing.T, dir string) (string, []string, func()) {
		return "file:" + filepath.Join(dir, "intermediate.key"), nil, nil
	},
	"tpm": func(t *testing.T, dir string) (string, []string, func()) {
		devtest.NeedTool(t, "swtpm")
		sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
		return "tpm:path=" + filepath.Join(dir, "intermediate.tpmkey") + ";" + sw.URIAttrs(), nil, sw.Kill
	},
	"pkcs11": func(t *testing.T, dir string) (string, []string, func()) {
		devtest.NeedTool(t, "softhsm2-util")
		tok, err := softhsm.New(dir, "node")
		if err != nil {
			t.Fatal(err)
		}
		return tok.URI("intermediate", []byte{7}), []string{tok.Env()}, func() { _ = tok.Remove() }
	},
}

// tieredNode is one trustd replica of the tiered setup.
type tieredNode struct {
	d      *daemon
	health string
	kill   func()
}

// TestTieredTalosWorkers: one offline (file) root, two nodes each with
// its own device and ServerAuth-only intermediate; Talos's worker code,
// trusting only the root, gets a certificate from each daemon, and the
// certificate served as apid serves it verifies to the root for talosctl.
// Taking one node's device away makes that daemon not ready while the
// other keeps serving.
func TestTieredTalosWorkers(t *testing.T) {
	for name, dev := range tieredDevices {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			rootURI := "file:" + filepath.Join(root, "root.key")
			ceremony(t, nil, "init", "--signer", rootURI, "--cluster", "e2e", "--out", filepath.Join(root, "ca"))
			rootPEM := readFile(t, filepath.Join(root, "ca", certdir.FileCACert))
			token := strings.TrimSpace(string(readFile(t, filepath.Join(root, "ca", certdir.FileToken))))
			nodes := []*tieredNode{enrol(t, dev, root, rootURI, "node-a"), enrol(t, dev, root, rootURI, "node-b")}
			for _, n := range nodes {
				ca, crt, id, err := workerRequest(t, n.d.Addr, token, rootPEM, csrFromCA, 30*time.Second)
				if err != nil {
					t.Fatalf("worker request: %v\n%s", err, n.d.Logs())
				}
				checkTieredIssued(t, ca, crt, id, rootPEM)
			}
			if kill := nodes[0].kill; kill != nil {
				kill()
				eventually(t, 15*time.Second, "not ready after its device went away", func() bool { return get(nodes[0].health+"/readyz") == http.StatusServiceUnavailable })
				if code := get(nodes[1].health + "/readyz"); code != http.StatusOK {
					t.Errorf("the other node is not ready (%d)", code)
				}
				if _, _, _, err := workerRequest(t, nodes[1].d.Addr, token, rootPEM, csrFromCA, 30*time.Second); err != nil {
					t.Errorf("the other node stopped serving: %v", err)
				}
			}
		})
	}
}

// enrol runs `intermediate request` on the node's device, `intermediate
// sign` with the root, and starts the daemon on os-ca.crt, token and
// issuer.crt.
func enrol(t *testing.T, dev tieredDevice, root, rootURI, name string) *tieredNode {
	t.Helper()
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(filepath.Join(dir, "certs"), 0o700); err != nil {
		t.Fatal(err)
	}
	uri, env, kill := dev(t, dir)
	csr := filepath.Join(dir, "node.csr")
	ceremony(t, env, "intermediate", "request", "--signer", uri, "--name", name, "--out", csr)
	ceremony(t, nil, "intermediate", "sign", "--signer", rootURI, "--ca", filepath.Join(root, "ca", certdir.FileCACert),
		"--csr", csr, "--out", filepath.Join(dir, "certs", certdir.FileIssuerChain), "--permitted-ip-ranges", "127.0.0.0/8,10.5.0.0/16")
	for _, f := range []string{certdir.FileCACert, certdir.FileToken} {
		if err := os.WriteFile(filepath.Join(dir, "certs", f), readFile(t, filepath.Join(root, "ca", f)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	health := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	d := startDaemon(t, append([]string{"TRUSTD_CERT_DIR=" + filepath.Join(dir, "certs"), "TRUSTD_SIGNER=" + uri,
		"TRUSTD_HEALTH_ADDR=" + health, "TRUSTD_READY_WINDOW=1s"}, env...)...)
	return &tieredNode{d: d, health: "http://" + health, kill: kill}
}

// checkTieredIssued checks the answer as a worker uses it: `ca` is the
// root alone (apid's client-CA pool); `crt` is leaf + intermediate, which
// apid loads with tls.X509KeyPair and talosctl verifies to the root.
func checkTieredIssued(t *testing.T, caBundle, crt []byte, id *talosx509.PEMEncodedCertificateAndKey, rootPEM []byte) {
	t.Helper()
	if strings.TrimSpace(string(caBundle)) != strings.TrimSpace(string(rootPEM)) {
		t.Errorf("returned ca is not exactly the root:\n%s", caBundle)
	}
	served, err := tls.X509KeyPair(crt, id.Key)
	if err != nil {
		t.Fatalf("apid cannot load the issued crt: %v", err)
	}
	if len(served.Certificate) != 2 {
		t.Fatalf("apid would serve %d certificates, want leaf + intermediate", len(served.Certificate))
	}
	chain, err := pki.ParseCertificates(crt)
	if err != nil {
		t.Fatal(err)
	}
	// talosctl: RootCAs = talosconfig ca (the root), the rest of the served
	// chain as intermediates, ServerName = the worker's IP.
	opts := stdx509.VerifyOptions{Roots: stdx509.NewCertPool(), Intermediates: stdx509.NewCertPool(), DNSName: "10.5.0.2", KeyUsages: []stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth}}
	opts.Roots.AppendCertsFromPEM(rootPEM)
	opts.Intermediates.AddCert(chain[1])
	if _, err := chain[0].Verify(opts); err != nil {
		t.Errorf("worker certificate does not verify to the root: %v", err)
	}
	if got := pki.DescribeEKU(chain[1]); got != "[ServerAuth]" || chain[1].MaxPathLen != 0 || !chain[1].MaxPathLenZero {
		t.Errorf("intermediate EKU %s, path length %d: want [ServerAuth], 0", got, chain[1].MaxPathLen)
	}
}
