package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/steward-trustd/steward-trustd/internal/authz"
	"github.com/steward-trustd/steward-trustd/internal/inventory"
)

// TestKubernetesSources runs the Node and Machine sources against a real
// kube-apiserver (and etcd) with Cluster API's published Machine CRD
// (v1.14.2, read from the Go module cache): a machine is allowed from
// its own address with its own names, refused for another's, and
// refused once its Machine is deleted.
func TestKubernetesSources(t *testing.T) {
	cfg := startAPIServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dyn := dynamic.NewForConfigOrDie(cfg)
	installMachineCRD(t, ctx, dyn)
	cs := kubernetes.NewForConfigOrDie(cfg)
	createNode(t, ctx, cs, "worker-1", "127.0.0.11")
	createMachine(t, ctx, dyn, "md-0-a", "127.0.0.12", "")
	createMachine(t, ctx, dyn, "md-0-b", "127.0.0.11", "worker-1")

	st, _ := authz.OpenState(filepath.Join(t.TempDir(), "state.json"))
	e := authz.NewEngine(authz.Rules{}, st, nil)
	k := &kubeSources{cfg: cfg, version: "v1beta2", combined: inventory.NewCombined(e, authz.Rules{}, "nodes", "machines"), log: slog.New(slog.DiscardHandler)}
	for _, s := range []string{"nodes", "machines"} {
		if err := k.start(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	decide := func(peer string, names ...string) string {
		r, err := e.Decide(&authz.Request{APIVersion: authz.APIVersion, Peer: peer, DNSNames: names, IPAddresses: []string{peer, "127.0.0.1"}})
		if err != nil {
			t.Fatal(err)
		}
		return r.Outcome
	}
	for _, c := range []struct{ peer, name, outcome string }{
		{"127.0.0.11", "worker-1", authz.OutcomeAllowed},
		{"127.0.0.11", "md-0-b", authz.OutcomeAllowed}, // the Machine merged into its Node
		{"127.0.0.12", "md-0-a", authz.OutcomeAllowed}, // first join: a Machine, no Node yet
		{"127.0.0.13", "worker-1", authz.OutcomeUnknownMachine},
		{"127.0.0.12", "worker-1", authz.OutcomePinned},
	} {
		if got := decide(c.peer, c.name); got != c.outcome {
			t.Errorf("%s asking for %s: %s, want %s", c.peer, c.name, got, c.outcome)
		}
	}
	if err := dyn.Resource(machinesGVR()).Namespace("default").Delete(ctx, "md-0-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return decide("127.0.0.12", "md-0-a") == authz.OutcomeUnknownMachine })
}

func machinesGVR() schema.GroupVersionResource { return machineGVR("v1beta2") }

func createNode(t *testing.T, ctx context.Context, cs kubernetes.Interface, name, ip string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}}}
	created, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status = n.Status
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func createMachine(t *testing.T, ctx context.Context, dyn dynamic.Interface, name, ip, node string) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
		"metadata": map[string]any{"name": name, "namespace": "default"},
		"spec": map[string]any{"clusterName": "c1", "bootstrap": map[string]any{"dataSecretName": "x"},
			"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal", "name": name}},
	}}
	res := dyn.Resource(machinesGVR()).Namespace("default")
	created, err := res.Create(ctx, u, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]any{"addresses": []any{map[string]any{"type": "InternalIP", "address": ip}}}
	if node != "" {
		status["nodeRef"] = map[string]any{"name": node}
	}
	created.Object["status"] = status
	if _, err := res.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// installMachineCRD creates Cluster API v1.14.2's Machine CRD from the
// module's published manifest (go mod download puts it in the cache).
func installMachineCRD(t *testing.T, ctx context.Context, dyn dynamic.Interface) {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", "sigs.k8s.io/cluster-api@v1.14.2").Output()
	if err != nil {
		t.Fatalf("go mod download sigs.k8s.io/cluster-api@v1.14.2: %v", err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download: %q: %v", out, err)
	}
	y, err := os.ReadFile(filepath.Join(mod.Dir, "core", "config", "crd", "bases", "cluster.x-k8s.io_machines.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(y, &u.Object); err != nil {
		t.Fatal(err)
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if _, err := crds.Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		_, err := dyn.Resource(machinesGVR()).Namespace("default").List(ctx, metav1.ListOptions{})
		return err == nil
	})
}

// startAPIServer starts etcd and kube-apiserver on loopback (as test/k8s
// does) and returns an admin's client configuration. kube-apiserver is
// the binary hack/k8s-build.sh builds, in $STEWARD_K8S_BIN.
func startAPIServer(t *testing.T) *rest.Config {
	t.Helper()
	bin := os.Getenv("STEWARD_K8S_BIN")
	etcd, err := exec.LookPath("etcd")
	if bin == "" || err != nil {
		if os.Getenv("STEWARD_REQUIRE_DEVICES") == "1" {
			t.Fatal("STEWARD_K8S_BIN and etcd are needed: make test-authorizer sets them (hack/k8s-build.sh, Debian's etcd-server)")
		}
		t.Skip("STEWARD_K8S_BIN or etcd missing: run make test-authorizer")
	}
	dir := t.TempDir()
	client := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	startProc(t, dir, "etcd", etcd, "--name=test", "--data-dir="+filepath.Join(dir, "etcd"), "--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer, "--initial-cluster=test="+peer, "--listen-metrics-urls=http://127.0.0.1:0")
	token := writeAPICredentials(t, dir)
	port := freePort(t)
	startProc(t, dir, "kube-apiserver", filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers="+client, "--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port),
		"--advertise-address=192.0.2.1", "--endpoint-reconciler-type=none",
		"--cert-dir="+filepath.Join(dir, "pki"), "--token-auth-file="+filepath.Join(dir, "tokens.csv"), "--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file="+filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"), "--service-cluster-ip-range=10.96.0.0/16", "--profiling=false")
	cfg := &rest.Config{Host: fmt.Sprintf("https://127.0.0.1:%d", port), BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(dir, "pki", "apiserver.crt")}, QPS: 50, Burst: 100}
	deadline := time.Now().Add(4 * time.Minute)
	for {
		if cs, err := kubernetes.NewForConfig(cfg); err == nil {
			if body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background()); err == nil && string(body) == "ok" {
				return cfg
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "kube-apiserver.log"))
			t.Fatalf("kube-apiserver not ready in 4m:\n%s", tail(string(log)))
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func tail(s string) string {
	if len(s) > 4000 {
		return s[len(s)-4000:]
	}
	return s
}

// startProc runs a process logging to dir/name.log, stopped (SIGTERM,
// then SIGKILL) by its PID when the test ends.
func startProc(t *testing.T, dir, name, bin string, args ...string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr, cmd.Env = f, f, []string{"PATH=" + os.Getenv("PATH")}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
}

// writeAPICredentials writes the service-account key pair and a static
// token file with one admin; it returns the admin's token.
func writeAPICredentials(t *testing.T, dir string) string {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalECPrivateKey(key)
	pub, _ := x509.MarshalPKIXPublicKey(key.Public())
	raw := make([]byte, 16)
	_, _ = rand.Read(raw)
	token := hex.EncodeToString(raw)
	for name, data := range map[string][]byte{
		"sa.key":     pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}),
		"sa.pub":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
		"tokens.csv": []byte(token + ",admin,admin,system:masters\n"),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return token
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
