package k8s

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// e2eEnv turns the node-level test on; hack/e2e-node.sh (make e2e) sets
// it after starting the cluster, and runs this test inside the cluster's
// network namespace.
const e2eEnv = "STEWARD_K8S_E2E"

// trustdSelector selects the trustd pods.
const trustdSelector = "app.kubernetes.io/name=steward-trustd"

// TestNodeE2E deploys layouts as shipped, each with only its site values
// set the documented way (a kustomize overlay written here), on the real
// kubelet and containerd hack/e2e-node.sh started; the image is the one
// `make image` wrote, imported with ctr. Each layout gets its own
// namespace and a pinned ClusterIP (the address workers dial, named in
// TRUSTD_CERT_SANS): its pods must turn Running and Ready, a TLS client
// dialling the Service through kube-proxy must get a chain that verifies
// to os-ca.crt for that address, and Talos v1.14.1's worker code must be
// issued a certificate through it.
func TestNodeE2E(t *testing.T) {
	e := newNodeEnv(t)
	t.Run("file", e.fileLayout)
	t.Run("pkcs11", e.pkcs11Layout)
	t.Run("ha-pkcs11", e.haLayout)
	t.Run("tpm-without-device", e.tpmLayoutUnplaced)
}

// nodeEnv is what hack/e2e-node.sh hands the test.
type nodeEnv struct {
	cp *controlPlane
	a  *applier
	// state is the run's state directory; gencreds the gencreds binary;
	// worker test/deploy's test binary holding Talos's worker code.
	state, gencreds, worker string
	// hsm holds the SoftHSM token's ceremony output (certs/) and PIN;
	// hsmImage is the module image made from it, rolloutImage the
	// steward-trustd image under a second tag.
	hsm, hsmImage, rolloutImage string
}

func newNodeEnv(t *testing.T) *nodeEnv {
	t.Helper()
	if os.Getenv(e2eEnv) != "1" {
		t.Skipf("node-level e2e: needs root and a running node; run `make e2e` (hack/e2e-node.sh sets %s=1)", e2eEnv)
	}
	e := &nodeEnv{state: os.Getenv("E2E_STATE"), gencreds: os.Getenv("E2E_GENCREDS"), worker: os.Getenv("E2E_TALOS_WORKER"),
		hsm: os.Getenv("E2E_HSM"), hsmImage: os.Getenv("E2E_HSM_IMAGE"), rolloutImage: os.Getenv("E2E_ROLLOUT_IMAGE")}
	for _, v := range []string{e.state, e.gencreds, e.worker, e.hsm, e.hsmImage, e.rolloutImage} {
		if v == "" {
			t.Fatalf("%s=1 needs E2E_STATE, E2E_GENCREDS, E2E_TALOS_WORKER, E2E_HSM, E2E_HSM_IMAGE and E2E_ROLLOUT_IMAGE: run it through `make e2e`", e2eEnv)
		}
	}
	e.cp = e2eControlPlane(t, e.state)
	e.a = newApplier(t, e.cp)
	return e
}

// fileLayout: overlays/file with gencreds' Secret, gencreds -san and
// TRUSTD_CERT_SANS naming the Service address, as the overlay documents
// for the LoadBalancer address.
func (e *nodeEnv) fileLayout(t *testing.T) {
	s := site{overlay: "overlays/file", namespace: "e2e-file", serviceIP: "10.0.0.50"}
	certs := filepath.Join(e.state, "certs-file")
	run(t, e.gencreds, "-cluster", "example", "-output", certs, "-san", s.serviceIP)
	ns := e.deploy(t, s, secretOf(t, filepath.Join(certs, "kubernetes-secret.yaml")))
	e.served(t, ns, s.serviceIP, certs, 1)
}

// deploy renders s and applies it server-side (strict) with secrets in
// its namespace, which it returns.
func (e *nodeEnv) deploy(t *testing.T, s site, secrets ...*unstructured.Unstructured) string {
	t.Helper()
	objs := renderPath(t, s.write(t))
	ns := namespaceOf(objs)
	if ns != s.namespace {
		t.Fatalf("the site overlay put the Deployment in %q, want %q", ns, s.namespace)
	}
	e.a.setUpNamespaces(t, objs)
	for _, o := range secrets {
		o.SetNamespace(ns)
		e.a.apply(t, o, false)
	}
	for _, o := range objs {
		e.a.apply(t, o, false)
	}
	if t.Failed() {
		t.FailNow()
	}
	return ns
}

// served waits for n trustd pods Running and Ready in ns, then checks the
// Service at serviceIP: TLS verifying to certs/os-ca.crt for that
// address, and a certificate for Talos's worker code.
func (e *nodeEnv) served(t *testing.T, ns, serviceIP, certs string, n int) {
	t.Helper()
	start := time.Now()
	pods := waitPodsReady(t, e.cp.client, ns, n, 3*time.Minute)
	t.Logf("%d pod(s) Running and Ready after %v (first: %s on %s)", len(pods), time.Since(start).Round(time.Second), pods[0].Name, pods[0].Status.PodIP)
	addr := net.JoinHostPort(serviceIP, "50001")
	chain := handshake(t, addr, filepath.Join(certs, "os-ca.crt"), time.Minute)
	t.Logf("TLS through the Service %s verified to os-ca.crt: leaf %q, issuer %q", addr, chain[0].Subject, chain[0].Issuer)
	if err := e.talosWorker(certs, addr); err != nil {
		t.Fatal(err)
	}
}

// talosWorker runs test/deploy's TestTalosWorkerThroughService (Talos
// v1.14.1's RemoteGenerator, both key types) against addr with the
// cluster's token and os-ca.crt from certs.
func (e *nodeEnv) talosWorker(certs, addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.worker, "-test.run", "^TestTalosWorkerThroughService$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "E2E_CERTS="+certs, "E2E_TRUSTD_ADDR="+addr)
	out, err := cmd.CombinedOutput()
	if err == nil && !strings.Contains(string(out), "--- PASS: TestTalosWorkerThroughService") {
		err = errors.New("the worker test did not pass (skipped?)")
	}
	if err != nil {
		return fmt.Errorf("Talos worker through the Service %s: %w\n%s", addr, err, out)
	}
	return nil
}

// e2eControlPlane is the API server hack/e2e-node.sh started, as admin.
func e2eControlPlane(t *testing.T, state string) *controlPlane {
	t.Helper()
	run := filepath.Join(state, "run")
	token, err := os.ReadFile(filepath.Join(run, "admin.token"))
	check(t, err)
	cp := &controlPlane{dir: run, warnings: &warningLog{}}
	cp.config = &rest.Config{Host: "https://127.0.0.1:6443", BearerToken: strings.TrimSpace(string(token)),
		TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(run, "pki", "apiserver.crt")},
		WarningHandler:  cp.warnings, QPS: 50, Burst: 100}
	cp.client, err = kubernetes.NewForConfig(cp.config)
	check(t, err)
	return cp
}

// site is the overlay a site writes over a shipped layout: its own
// namespace, TRUSTD_CERT_SANS naming the Service address workers dial
// (here the ClusterIP, pinned so that certificates can name it in
// advance), plus the layout's own site values as kustomize patches.
type site struct {
	overlay   string // the shipped layout, under deploy/kubernetes
	namespace string
	serviceIP string
	patches   string // more entries of the kustomization's patches list
}

// write writes the site overlay into a temporary directory and returns it.
func (s site) write(t *testing.T) string {
	t.Helper()
	shipped, err := filepath.Abs(filepath.Join(manifests, s.overlay))
	check(t, err)
	dir := filepath.Join(t.TempDir(), "site")
	check(t, os.MkdirAll(dir, 0o755))
	// kustomize takes a resource directory only as a relative path.
	shipped, err = filepath.Rel(dir, shipped)
	check(t, err)
	kz := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: %s
resources:
  - %s
patches:
%s  - target: {kind: Service, name: steward-trustd}
    patch: |-
      - op: add
        path: /spec/clusterIP
        value: %q
%s`, s.namespace, shipped, podSpecPatch(fmt.Sprintf(`            containers:
              - name: trustd
                env:
                  - {name: TRUSTD_CERT_SANS, value: %q}
`, s.serviceIP)), s.serviceIP, s.patches)
	check(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kz), 0o644))
	return dir
}

// podSpecPatch is a kustomization patches entry: a strategic-merge patch
// of the trustd Deployment's pod spec with podSpec (YAML indented under
// spec.template.spec).
func podSpecPatch(podSpec string) string {
	return `  - patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: steward-trustd}
      spec:
        template:
          spec:
` + podSpec
}

// secretOf reads the Secret manifest gencreds or the ceremony wrote
// (applied with kubectl -n NS apply -f, as the overlays' recipes do).
func secretOf(t *testing.T, path string) *unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	check(t, err)
	defer f.Close()
	o := &unstructured.Unstructured{}
	check(t, yaml.NewYAMLOrJSONDecoder(f, 4096).Decode(&o.Object))
	if o.GetKind() != "Secret" {
		t.Fatalf("%s: a %s, want a Secret", path, o.GetKind())
	}
	return o
}

// namespaceOf is the namespace of the rendered Deployment.
func namespaceOf(objs []*unstructured.Unstructured) string {
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			return o.GetNamespace()
		}
	}
	return ""
}

// waitPodsReady waits for n trustd pods Running with condition Ready; on
// timeout it prints the pods' status and the namespace's events.
func waitPodsReady(t *testing.T, c kubernetes.Interface, ns string, n int, timeout time.Duration) []corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if p := readyPods(t, c, ns); len(p) >= n {
			return p
		}
		time.Sleep(time.Second)
	}
	dumpPods(t, c, ns)
	t.Fatalf("not %d trustd pods Running and Ready in %s within %v", n, ns, timeout)
	return nil
}

// readyPods are the trustd pods in ns that are Running, Ready and not
// being deleted.
func readyPods(t *testing.T, c kubernetes.Interface, ns string) []corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: trustdSelector})
	if err != nil {
		t.Logf("list pods: %v", err)
		return nil
	}
	var ready []corev1.Pod
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && podReady(&p) {
			ready = append(ready, p)
		}
	}
	return ready
}

func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

func dumpPods(t *testing.T, c kubernetes.Interface, ns string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range pods.Items {
			t.Logf("pod %s: phase %s, conditions %+v, containers %+v", p.Name, p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
		}
	}
	if ev, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, e := range ev.Items {
			t.Logf("event %s %s/%s: %s: %s", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
}

// handshake dials addr until a TLS handshake succeeds whose chain verifies
// to the CA in caFile for addr's IP (kube-proxy programs the Service a
// moment after the pod turns Ready); it fails with the last error.
func handshake(t *testing.T, addr, caFile string, timeout time.Duration) []*x509.Certificate {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	check(t, err)
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("%s holds no certificate", caFile)
	}
	host, _, err := net.SplitHostPort(addr)
	check(t, err)
	cfg := &tls.Config{RootCAs: roots, ServerName: host, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}
	deadline := time.Now().Add(timeout)
	for {
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
		conn, err := d.Dial("tcp", addr)
		if err == nil {
			defer conn.Close()
			return conn.(*tls.Conn).ConnectionState().VerifiedChains[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("TLS to %s verifying to %s for %s: %v", addr, caFile, host, err)
		}
		time.Sleep(time.Second)
	}
}

// run runs a command, failing the test with its output.
func run(t *testing.T, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}
