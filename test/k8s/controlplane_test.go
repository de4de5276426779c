package k8s

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// required reports whether tests must fail instead of skipping when a
// tool is missing: make test sets STEWARD_REQUIRE_DEVICES=1 (as
// internal/devtest reads it; this module does not import the project so
// that k8s.io/kubernetes's module graph stays as upstream pins it).
func required() bool { return os.Getenv("STEWARD_REQUIRE_DEVICES") == "1" }

// need skips t, or fails it when required, with how to get what is missing.
func need(t *testing.T, what, how string) {
	t.Helper()
	if required() {
		t.Fatalf("%s is missing: %s", what, how)
	}
	t.Skipf("%s is missing: %s", what, how)
}

// kubeBinary is the kube-* command name from $STEWARD_K8S_BIN, the
// directory hack/k8s-build.sh prints (make test-k8s sets it).
func kubeBinary(t *testing.T, name string) string {
	t.Helper()
	dir := os.Getenv("STEWARD_K8S_BIN")
	how := "run `make test-k8s`, or STEWARD_K8S_BIN=$(hack/k8s-build.sh) go test ./... in test/k8s"
	if dir == "" {
		need(t, "STEWARD_K8S_BIN", how)
	}
	bin := filepath.Join(dir, name)
	if _, err := os.Stat(bin); err != nil {
		need(t, bin, how)
	}
	return bin
}

// proc is a process the test started; it is stopped by its PID when the
// test ends (SIGTERM, then SIGKILL after the grace period).
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// grace is how long a stopped process may take to exit.
const grace = 15 * time.Second

func startProc(t *testing.T, dir, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(bin, args...), log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	check(t, err)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	if err := p.cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(p.stop)
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) stop() {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// tail is the end of the process's log, for failure messages.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return fmt.Sprintf("--- %s log (%s), last lines:\n%s", p.name, p.log, b)
}

// controlPlane is etcd and kube-apiserver on loopback ports, everything
// under one state directory.
type controlPlane struct {
	dir       string
	etcd      *proc
	apiserver *proc
	config    *rest.Config
	client    kubernetes.Interface
	warnings  *warningLog
}

// startControlPlane starts etcd (Debian's etcd-server) and kube-apiserver
// with static-token authentication (one admin in system:masters),
// Node,RBAC authorization, the default admission plugins (PodSecurity
// among them) plus NodeRestriction, and privileged pods allowed (the TPM
// device plugin needs that, as on kubeadm clusters). It waits at most
// 3 minutes for /readyz; on failure and at the end of a failed test it
// prints both logs.
func startControlPlane(t *testing.T) *controlPlane {
	t.Helper()
	etcdBin, err := exec.LookPath("etcd")
	if err != nil {
		need(t, "etcd", "install Debian's etcd-server (hack/deps.sh does)")
	}
	apiserverBin := kubeBinary(t, "kube-apiserver")
	cp := &controlPlane{dir: t.TempDir(), warnings: &warningLog{}}
	t.Cleanup(func() {
		if t.Failed() {
			cp.logs(t)
		}
	})
	cp.etcd = startEtcd(t, cp.dir, etcdBin)
	token := cp.writeCredentials(t)
	port := freePort(t)
	cp.apiserver = startProc(t, cp.dir, "kube-apiserver", apiserverBin,
		"--etcd-servers="+etcdURL(cp.dir), "--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port),
		"--advertise-address=192.0.2.1", "--endpoint-reconciler-type=none",
		"--cert-dir="+filepath.Join(cp.dir, "pki"), "--token-auth-file="+filepath.Join(cp.dir, "tokens.csv"),
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction", "--allow-privileged=true",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+filepath.Join(cp.dir, "sa.pub"), "--service-account-signing-key-file="+filepath.Join(cp.dir, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16", "--profiling=false")
	cp.config = &rest.Config{Host: fmt.Sprintf("https://127.0.0.1:%d", port), BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(cp.dir, "pki", "apiserver.crt")},
		WarningHandler:  cp.warnings, QPS: 50, Burst: 100}
	cp.waitReady(t, 3*time.Minute)
	return cp
}

// logs prints the end of the API server's and etcd's logs.
func (cp *controlPlane) logs(t *testing.T) {
	for _, p := range []*proc{cp.apiserver, cp.etcd} {
		if p != nil {
			t.Log(p.tail())
		}
	}
}

// startEtcd runs etcd on two free loopback ports (client, peer) with its
// data in dir/etcd and waits until the client port accepts connections.
func startEtcd(t *testing.T, dir, bin string) *proc {
	t.Helper()
	client, peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	check(t, os.WriteFile(filepath.Join(dir, "etcd.url"), []byte(client), 0o600))
	p := startProc(t, dir, "etcd", bin, "--name=test", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer, "--initial-cluster=test="+peer,
		"--listen-metrics-urls=http://127.0.0.1:0")
	eventually(t, p, 30*time.Second, "etcd accepting connections", func() bool {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(client, "http://"), time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return p
}

func etcdURL(dir string) string {
	b, _ := os.ReadFile(filepath.Join(dir, "etcd.url"))
	return string(b)
}

// writeCredentials writes the service-account signing key pair and the static
// token file (the admin's random token, which it returns).
func (cp *controlPlane) writeCredentials(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check(t, err)
	der, err := x509.MarshalECPrivateKey(key)
	check(t, err)
	check(t, os.WriteFile(filepath.Join(cp.dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600))
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	check(t, err)
	check(t, os.WriteFile(filepath.Join(cp.dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600))
	raw := make([]byte, 16)
	_, err = rand.Read(raw)
	check(t, err)
	token := hex.EncodeToString(raw)
	check(t, os.WriteFile(filepath.Join(cp.dir, "tokens.csv"), []byte(token+",admin,admin,system:masters\n"), 0o600))
	return token
}

// waitReady polls /readyz until it answers ok; the API server's own
// log is printed if it exits or does not get ready in time.
func (cp *controlPlane) waitReady(t *testing.T, timeout time.Duration) {
	t.Helper()
	eventually(t, cp.apiserver, timeout, "kube-apiserver /readyz", func() bool {
		if _, err := os.Stat(cp.config.CAFile); err != nil {
			return false
		}
		if cp.client == nil {
			c, err := kubernetes.NewForConfig(cp.config)
			if err != nil {
				return false
			}
			cp.client = c
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		body, err := cp.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok"
	})
}

// eventually polls cond every 200 ms until it holds; it fails t when p
// exits first or timeout passes (startControlPlane prints the logs).
func eventually(t *testing.T, p *proc, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if p.exited() {
			t.Fatalf("%s exited (%v) before %s", p.name, p.err, what)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// warningLog collects the API server's warnings (Warning headers), which
// a layout must not cause.
type warningLog struct {
	mu   sync.Mutex
	msgs []string
}

// HandleWarningHeader implements rest.WarningHandler.
func (w *warningLog) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

// take returns and clears the warnings so far.
func (w *warningLog) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.msgs
	w.msgs = nil
	return m
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func check(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
