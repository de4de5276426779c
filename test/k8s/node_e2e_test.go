package k8s

import (
	"context"
	"crypto/tls"
	"crypto/x509"
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

// TestNodeE2E deploys overlays/file as shipped, with the site values set
// the documented way (gencreds -san and TRUSTD_CERT_SANS naming the
// address workers dial, through a kustomize overlay written here), on the
// real kubelet and containerd hack/e2e-node.sh started; the image is the
// one `make image` wrote, imported with ctr. The pod must turn Running and
// Ready, and a TLS client dialling the Service's ClusterIP (kube-proxy,
// nftables) must get a chain that verifies to os-ca.crt for that address.
func TestNodeE2E(t *testing.T) {
	if os.Getenv(e2eEnv) != "1" {
		t.Skipf("node-level e2e: needs root and a running node; run `make e2e` (hack/e2e-node.sh sets %s=1)", e2eEnv)
	}
	// E2E_SERVICE_IP: the ClusterIP the test's overlay gives the Service,
	// the address workers dial, named in TRUSTD_CERT_SANS and gencreds -san
	// as the file overlay documents for the LoadBalancer address.
	state, gencreds, serviceIP := os.Getenv("E2E_STATE"), os.Getenv("E2E_GENCREDS"), os.Getenv("E2E_SERVICE_IP")
	if state == "" || gencreds == "" || net.ParseIP(serviceIP) == nil {
		t.Fatalf("%s=1 needs E2E_STATE, E2E_GENCREDS and E2E_SERVICE_IP: run it through `make e2e`", e2eEnv)
	}
	cp := e2eControlPlane(t, state)
	a := newApplier(t, cp)
	// In the state directory: test/deploy's TestTalosWorkerThroughService
	// reads the token and os-ca.crt from there next.
	certs := filepath.Join(state, "certs")
	run(t, gencreds, "-cluster", "example", "-output", certs, "-san", serviceIP)
	objs := renderPath(t, siteOverlay(t, serviceIP))
	a.setUpNamespaces(t, objs)
	a.apply(t, secretOf(t, filepath.Join(certs, "kubernetes-secret.yaml"), namespaceOf(objs)), false)
	for _, o := range objs {
		a.apply(t, o, false)
	}
	if t.Failed() {
		t.FailNow()
	}
	start := time.Now()
	pod := waitPodReady(t, cp.client, namespaceOf(objs), 3*time.Minute)
	t.Logf("pod %s Running and Ready on %s after %v", pod.Name, pod.Status.PodIP, time.Since(start).Round(time.Second))
	chain := handshake(t, net.JoinHostPort(serviceIP, "50001"), filepath.Join(certs, "os-ca.crt"), time.Minute)
	t.Logf("TLS through the Service %s:50001 verified to os-ca.crt: leaf %q, issuer %q", serviceIP, chain[0].Subject, chain[0].Issuer)
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

// siteOverlay writes the overlay a site would: overlays/file as shipped,
// with TRUSTD_CERT_SANS naming the Service address workers dial (here the
// ClusterIP, pinned so that the certificate can name it in advance).
func siteOverlay(t *testing.T, serviceIP string) string {
	t.Helper()
	file, err := filepath.Abs(filepath.Join(manifests, "overlays", "file"))
	check(t, err)
	dir := filepath.Join(t.TempDir(), "site")
	check(t, os.MkdirAll(dir, 0o755))
	// kustomize takes a resource directory only as a relative path.
	file, err = filepath.Rel(dir, file)
	check(t, err)
	kz := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
patches:
  - patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: steward-trustd}
      spec:
        template:
          spec:
            containers:
              - name: trustd
                env:
                  - {name: TRUSTD_CERT_SANS, value: %q}
  - target: {kind: Service, name: steward-trustd}
    patch: |-
      - op: add
        path: /spec/clusterIP
        value: %q
`, file, serviceIP, serviceIP)
	check(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kz), 0o644))
	return dir
}

// secretOf reads the Secret manifest gencreds wrote, into namespace ns
// (kubectl -n NS apply -f, as the overlay's recipe does).
func secretOf(t *testing.T, path, ns string) *unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	check(t, err)
	defer f.Close()
	o := &unstructured.Unstructured{}
	check(t, yaml.NewYAMLOrJSONDecoder(f, 4096).Decode(&o.Object))
	if o.GetKind() != "Secret" {
		t.Fatalf("%s: a %s, want a Secret", path, o.GetKind())
	}
	o.SetNamespace(ns)
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

// waitPodReady waits for a trustd pod Running with condition Ready; on
// timeout it prints the pods' status and the namespace's events.
func waitPodReady(t *testing.T, c kubernetes.Interface, ns string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if p := readyPod(t, c, ns); p != nil {
			return p
		}
		time.Sleep(time.Second)
	}
	dumpPods(t, c, ns)
	t.Fatalf("no trustd pod Running and Ready in %s within %v", ns, timeout)
	return nil
}

func readyPod(t *testing.T, c kubernetes.Interface, ns string) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: trustdSelector})
	if err != nil {
		t.Logf("list pods: %v", err)
		return nil
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return p
			}
		}
	}
	return nil
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
