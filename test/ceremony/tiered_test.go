package ceremony_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/internal/doctor"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer/file"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// tierNode is one trustd node of the tiered setup: its own device, its
// intermediate, its daemon.
type tierNode struct {
	name, uri string
	nextURI   string // where a rotation creates the node's next key
	env       []string
	sw        *tpmsim.Swtpm // the node's TPM (tpm backend only)
	certDir   string
	d         *daemon
	health    string
}

// tierRun is one tiered setup: a file root offline, nodes on a backend.
type tierRun struct {
	t        *testing.T
	dir      string
	rootURI  string
	rootCA   string // the root's os-ca.crt
	rootCert *x509.Certificate
}

// TestTiered runs the tiered setup end to end on every backend: a file
// root, two nodes with their own device and intermediate, a daemon on
// each; workers (trusting only the root) get certificates from both; an
// apid using the returned `ca` accepts the root's talosconfig and refuses
// one minted with an intermediate's key.
func TestTiered(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { tiered(t, b) })
	}
}

func tiered(t *testing.T, b backend) {
	tr := newTierRun(t)
	nodes := []*tierNode{tr.node(b, "node-a"), tr.node(b, "node-b")}
	wc := workerConfig(t, filepath.Join(tr.dir, "root", certdir.FileWorkerPatch))
	tc := filepath.Join(tr.dir, "admin.talosconfig")
	mustCeremony(t, nil, "talosconfig", "--signer", tr.rootURI, "--ca", tr.rootCA, "--context", "e2e", "--endpoints", "127.0.0.1", "--out", tc)
	for _, n := range nodes {
		srv, size := apid(t, n.d, wc)
		if size != 1 {
			t.Errorf("%s: ca holds %d certificates, want the root only", n.name, size)
		}
		login(t, readFile(t, tc), srv, true, "os:admin")
		login(t, tr.rogueTalosconfig(n), srv, false, "")
	}
	tr.rotate(nodes[1], wc)
	if b.name == "tpm" {
		tr.killOne(nodes, wc)
	}
}

// rotate replaces a node's intermediate key: new key and request while
// the daemon keeps serving, the root signs, finish, restart on the new key.
func (tr *tierRun) rotate(n *tierNode, wc *doctor.WorkerConfig) {
	t := tr.t
	mustCeremony(t, n.env, "rotate", "--intermediate", "--new-signer", n.nextURI, "--name", n.name, "--out", n.certDir)
	mustCeremony(t, nil, "intermediate", "sign", "--signer", tr.rootURI, "--ca", tr.rootCA, "--csr", filepath.Join(n.certDir, certdir.FileNextIssuerCSR),
		"--out", filepath.Join(n.certDir, certdir.FileNextIssuerChain), "--dir", filepath.Join(tr.dir, "root"))
	apid(t, n.d, wc) // the old key still serves during the overlap
	finish := []string{"rotate", "--intermediate", "--finish", "--new-signer", n.nextURI, "--out", n.certDir}
	mustCeremony(t, n.env, finish...)
	if r := mustCeremony(t, n.env, finish...); !strings.Contains(r.stdout, "already completed") {
		t.Errorf("finish re-run: %s", r)
	}
	if _, err := os.Stat(filepath.Join(n.certDir, certdir.FileNextIssuerChain)); err == nil {
		t.Error("issuer.next.crt left after finish")
	}
	if r := mustCeremony(t, n.env, "status", "--signer", n.nextURI, "--ca", filepath.Join(n.certDir, certdir.FileCACert)); !strings.Contains(r.stdout, "chain:        ok") {
		t.Errorf("status of the new key: %s", r)
	}
	n.d.Stop(t)
	n.d = startDaemon(t, n.certDir, n.nextURI, append(n.env, "TRUSTD_HEALTH_ADDR="+n.health, "TRUSTD_READY_WINDOW=1s")...)
	apid(t, n.d, wc)
}

func newTierRun(t *testing.T) *tierRun {
	dir := t.TempDir()
	tr := &tierRun{t: t, dir: dir, rootURI: "file:" + filepath.Join(dir, "root.key"), rootCA: filepath.Join(dir, "root", certdir.FileCACert)}
	mustCeremony(t, nil, "init", "--signer", tr.rootURI, "--cluster", "e2e", "--out", filepath.Join(dir, "root"))
	c, err := pki.ParseCertificate(readFile(t, tr.rootCA))
	if err != nil {
		t.Fatal(err)
	}
	tr.rootCert = c
	return tr
}

// node enrols one node: key and request on its device, the root signs,
// the daemon serves a cert dir of os-ca.crt, token and issuer.crt.
func (tr *tierRun) node(b backend, name string) *tierNode {
	t := tr.t
	n := &tierNode{name: name, certDir: filepath.Join(tr.dir, name, "certs")}
	if b.name == "tpm" {
		requireScheme(t, "tpm")
		n.sw = tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
		n.uri = "tpm:path=" + filepath.Join(tr.dir, name, "intermediate.tpmkey") + ";" + n.sw.URIAttrs()
		n.nextURI = "tpm:path=" + filepath.Join(tr.dir, name, "intermediate-next.tpmkey") + ";" + n.sw.URIAttrs()
	} else {
		uri, env, _, _ := b.setup(t)
		n.uri, n.nextURI, n.env = uri(name), uri(name+"-next"), env
	}
	csr := filepath.Join(tr.dir, name, "node.csr")
	req := []string{"intermediate", "request", "--signer", n.uri, "--name", name, "--out", csr}
	mustCeremony(t, n.env, req...)
	// A second run does not make a second key: it finds its own.
	if r := mustCeremony(t, n.env, req...); !strings.Contains(r.stdout, "created by an earlier run") {
		t.Errorf("request re-run: %s", r)
	}
	issuer := filepath.Join(n.certDir, certdir.FileIssuerChain)
	mustCeremony(t, nil, "intermediate", "sign", "--signer", tr.rootURI, "--ca", tr.rootCA, "--csr", csr, "--out", issuer,
		"--permitted-ip-ranges", "127.0.0.0/8,10.0.0.0/8", "--dir", filepath.Join(tr.dir, "root"))
	for _, f := range []string{certdir.FileCACert, certdir.FileToken} {
		if err := os.WriteFile(filepath.Join(n.certDir, f), readFile(t, filepath.Join(tr.dir, "root", f)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if r := mustCeremony(t, n.env, "status", "--signer", n.uri, "--ca", filepath.Join(n.certDir, certdir.FileCACert)); !strings.Contains(r.stdout, "chain:        ok") || !strings.Contains(r.stdout, "[ServerAuth]") {
		t.Errorf("status of the node's chain: %s", r)
	}
	n.health = fmt.Sprintf("127.0.0.1:%d", devtest.FreePort(t))
	n.d = startDaemon(t, n.certDir, n.uri, append(n.env, "TRUSTD_HEALTH_ADDR="+n.health, "TRUSTD_READY_WINDOW=1s")...)
	tr.refusedIntermediates(n)
	return n
}

// rogueTalosconfig is what a compromised node could mint: an os:admin
// talosconfig signed with its intermediate's key, the intermediate sent
// along as the chain.
func (tr *tierRun) rogueTalosconfig(n *tierNode) []byte {
	t := tr.t
	out := filepath.Join(tr.dir, n.name, "rogue.talosconfig")
	mustCeremony(t, n.env, "talosconfig", "--signer", n.uri, "--ca", filepath.Join(n.certDir, certdir.FileIssuerChain), "--context", "rogue", "--endpoints", "127.0.0.1", "--out", out)
	cfg, err := clientconfig.FromBytes(readFile(t, out))
	if err != nil {
		t.Fatal(err)
	}
	ctx := cfg.Contexts[cfg.Context]
	crt, _ := base64.StdEncoding.DecodeString(ctx.Crt)
	ctx.Crt = base64.StdEncoding.EncodeToString(append(crt, readFile(t, filepath.Join(n.certDir, certdir.FileIssuerChain))...))
	data, err := cfg.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// refusedIntermediates: the daemon does not start with an intermediate for
// the node's key that has no EKU or allows ClientAuth.
func (tr *tierRun) refusedIntermediates(n *tierNode) {
	t := tr.t
	good, err := pki.ParseCertificate(readFile(t, filepath.Join(n.certDir, certdir.FileIssuerChain)))
	if err != nil {
		t.Fatal(err)
	}
	root, err := (&file.Backend{}).Open(context.Background(), tr.rootURI)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for name, eku := range map[string][]x509.ExtKeyUsage{
		"has no ExtKeyUsage": nil,
		"allows ClientAuth":  {x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	} {
		tmpl := *good
		tmpl.ExtKeyUsage = eku
		der, err := x509.CreateCertificate(rand.Reader, &tmpl, tr.rootCert, good.PublicKey, root)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(tr.dir, n.name, "bad-"+strings.ReplaceAll(name, " ", "-"))
		for f, data := range map[string][]byte{
			certdir.FileCACert: readFile(t, filepath.Join(n.certDir, certdir.FileCACert)), certdir.FileToken: readFile(t, filepath.Join(n.certDir, certdir.FileToken)),
			certdir.FileIssuerChain: pki.EncodeCertificates(mustParse(t, der)),
		} {
			writeFile(t, filepath.Join(dir, f), data)
		}
		code, stderr := runDaemonOnce(t, append(n.env, "TRUSTD_CERT_DIR="+dir, "TRUSTD_SIGNER="+n.uri))
		if code != 1 || !strings.Contains(stderr, certdir.FileIssuerChain) || !strings.Contains(stderr, name) {
			t.Errorf("%s: daemon with an intermediate that %s: exit %d\n%s", n.name, name, code, stderr)
		}
	}
}

// killOne kills one node's TPM: that daemon turns not ready, the other
// keeps serving.
func (tr *tierRun) killOne(nodes []*tierNode, wc *doctor.WorkerConfig) {
	t := tr.t
	nodes[0].sw.Kill()
	deadline := time.Now().Add(15 * time.Second)
	for readyz(nodes[0].health) != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatalf("%s stayed ready with its TPM gone\n%s", nodes[0].name, nodes[0].d.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code := readyz(nodes[1].health); code != http.StatusOK {
		t.Errorf("%s not ready (%d) while only the other node's TPM is gone", nodes[1].name, code)
	}
	apid(t, nodes[1].d, wc)
}

func readyz(addr string) int {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// runDaemonOnce runs steward-trustd expecting it to exit at start.
func runDaemonOnce(t *testing.T, env []string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "steward-trustd"))
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "TRUSTD_LISTEN_ADDRESS=127.0.0.1", fmt.Sprintf("TRUSTD_PORT=%d", devtest.FreePort(t))}, env...)
	out, _ := cmd.CombinedOutput()
	return cmd.ProcessState.ExitCode(), string(out)
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func mustParse(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestIntermediateRequestKilledAtEveryStep kills `intermediate request`
// at each of its crash points (file backend) and re-runs it: the re-run
// completes with the one key the first run made (never a second), one
// intermediate.key receipt, no intent record or temporary file left, and
// a request signed by that key.
func TestIntermediateRequestKilledAtEveryStep(t *testing.T) {
	tmpl := t.TempDir()
	if err := os.Mkdir(filepath.Join(tmpl, "keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	args := []string{"intermediate", "request", "--signer", fileKey(tmpl, "node"), "--name", "node-a", "--out", filepath.Join(tmpl, "out", "node.csr")}
	steps := killAtEveryStep(t, tmpl, args, 4, func(root string, _ []string, step string) {
		checkRequestAfterKill(t, root, step)
	})
	t.Logf("killed at each of %d steps (%s), every re-run completed with the first run's key", len(steps), strings.Join(steps, ", "))
}

func checkRequestAfterKill(t *testing.T, root, step string) {
	t.Helper()
	keys, err := os.ReadDir(filepath.Join(root, "keys"))
	if err != nil || len(keys) != 1 {
		t.Fatalf("killed at %s: keys %v (%v), want exactly one", step, names(keys), err)
	}
	_ = filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err == nil && (strings.Contains(e.Name(), ".tmp-") || strings.HasSuffix(e.Name(), ".intent")) {
			t.Errorf("killed at %s: left %s", step, p)
		}
		return nil
	})
	rs, err := keystore.ReadReceipts(keystore.OSDir{Root: filepath.Join(root, "out")})
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, r := range rs {
		count[string(r.Operation)]++
	}
	if count["intermediate.key"] != 1 || count["intermediate.request"] < 1 {
		t.Errorf("killed at %s: receipts %v, want one intermediate.key and a request", step, count)
	}
	key, err := (&file.Backend{}).Open(context.Background(), fileKey(root, "node"))
	if err != nil {
		t.Fatal(err)
	}
	defer key.Close()
	csr, err := pki.ParseCSR(readFile(t, filepath.Join(root, "out", "node.csr")), 0)
	if err != nil || !pki.KeyMatchesCert(key.Public(), &x509.Certificate{PublicKey: csr.PublicKey}) {
		t.Errorf("killed at %s: the request is not signed by the node's key: %v", step, err)
	}
}
