package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// relaxAntiAffinity is the one test patch of the HA layout: the shipped
// required pod anti-affinity (never two replicas on one node: one device,
// one failure) cannot place two replicas on this single node, so the test
// removes it. Everything else — replicas, the PodDisruptionBudget, the
// rolling update without surge — stays as shipped.
const relaxAntiAffinity = `  - target: {kind: Deployment, name: steward-trustd}
    patch: |-
      - op: remove
        path: /spec/template/spec/affinity
`

// haLayout: overlays/ha-pkcs11 (two replicas on the SoftHSM key, as on a
// clustered HSM) on one node. It must keep serving while one pod is
// evicted through the Eviction API, the PodDisruptionBudget refusing a
// second eviction while one is down; and a rolling update to a new image
// tag must never leave zero ready endpoints or replicas (watched
// throughout), with Talos's worker code issued certificates during it.
func (e *nodeEnv) haLayout(t *testing.T) {
	s := site{overlay: "overlays/ha-pkcs11", namespace: "e2e-ha", serviceIP: "10.0.0.52", patches: e.hsmPatches() + relaxAntiAffinity}
	ns := e.deploy(t, s, e.hsmSecrets(t)...)
	certs, addr := filepath.Join(e.hsm, "certs"), s.serviceIP+":50001"
	e.served(t, ns, s.serviceIP, certs, 2)
	w := watchReady(t, e.cp.client, ns)
	e.evictOne(t, ns, certs, addr)
	waitPodsReady(t, e.cp.client, ns, 2, 3*time.Minute)
	e.rollingUpdate(t, ns, certs, addr)
	w.stop(t)
}

// evictOne evicts one replica (allowed: the budget's maxUnavailable is 1),
// then asks to evict the other, which the budget must refuse (429) while
// the first is down, and checks the Service still issues certificates.
func (e *nodeEnv) evictOne(t *testing.T, ns, certs, addr string) {
	t.Helper()
	waitDisruptionsAllowed(t, e.cp.client, ns, 1, time.Minute)
	pods := readyPods(t, e.cp.client, ns)
	if len(pods) != 2 {
		t.Fatalf("want 2 ready replicas before the eviction, got %d", len(pods))
	}
	if err := evict(e.cp.client, &pods[0]); err != nil {
		t.Fatalf("evict %s with 2 of 2 ready: %v", pods[0].Name, err)
	}
	err := evict(e.cp.client, &pods[1])
	if !apierrors.IsTooManyRequests(err) {
		t.Fatalf("evict %s while %s is down: got %v, want 429 from the PodDisruptionBudget", pods[1].Name, pods[0].Name, err)
	}
	t.Logf("evicted %s; second eviction refused: %v", pods[0].Name, err)
	if err := e.talosWorker(certs, addr); err != nil {
		t.Fatalf("with one replica evicted: %v", err)
	}
}

func evict(c kubernetes.Interface, p *corev1.Pod) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.CoreV1().Pods(p.Namespace).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
}

// waitDisruptionsAllowed waits until the disruption controller has
// judged the budget (status.disruptionsAllowed == n).
func waitDisruptionsAllowed(t *testing.T, c kubernetes.Interface, ns string, n int32, timeout time.Duration) {
	t.Helper()
	var last int32 = -1
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(time.Second) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		pdb, err := c.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "steward-trustd", metav1.GetOptions{})
		cancel()
		if err == nil && pdb.Status.ObservedGeneration == pdb.Generation && pdb.Status.DisruptionsAllowed == n {
			return
		}
		if err == nil {
			last = pdb.Status.DisruptionsAllowed
		}
	}
	t.Fatalf("PodDisruptionBudget steward-trustd in %s: disruptionsAllowed %d, want %d within %v", ns, last, n, timeout)
}

// rollingUpdate sets the trustd container's image to the second tag and,
// until the rollout completes, keeps Talos's worker code asking the
// Service for certificates: every attempt must succeed.
func (e *nodeEnv) rollingUpdate(t *testing.T, ns, certs, addr string) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
		"containers": []map[string]any{{"name": "trustd", "image": e.rolloutImage}}}}}})
	check(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err = e.cp.client.AppsV1().Deployments(ns).Patch(ctx, "steward-trustd", types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	cancel()
	check(t, err)
	start, attempts := time.Now(), 0
	for deadline := start.Add(4 * time.Minute); !rolledOut(t, e.cp.client, ns, e.rolloutImage); attempts++ {
		if time.Now().After(deadline) {
			dumpPods(t, e.cp.client, ns)
			t.Fatalf("rollout to %s not complete within 4m", e.rolloutImage)
		}
		if err := e.talosWorker(certs, addr); err != nil {
			t.Fatalf("during the rollout (attempt %d, %v in): %v", attempts+1, time.Since(start).Round(time.Second), err)
		}
	}
	if attempts == 0 {
		t.Fatal("the rollout completed before any worker request was made during it: nothing was proved")
	}
	t.Logf("rollout to %s complete after %v; %d worker runs during it all issued", e.rolloutImage, time.Since(start).Round(time.Second), attempts)
}

// rolledOut: the Deployment's controller has seen the new template and
// every replica is updated, ready and available, on the new image.
func rolledOut(t *testing.T, c kubernetes.Interface, ns, image string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := c.AppsV1().Deployments(ns).Get(ctx, "steward-trustd", metav1.GetOptions{})
	if err != nil {
		t.Logf("get deployment: %v", err)
		return false
	}
	want := *d.Spec.Replicas
	st := d.Status
	if st.ObservedGeneration < d.Generation || st.UpdatedReplicas != want || st.ReadyReplicas != want || st.AvailableReplicas != want || st.Replicas != want {
		return false
	}
	pods := readyPods(t, c, ns)
	for _, p := range pods {
		if p.Spec.Containers[0].Image != image {
			return false
		}
	}
	return len(pods) == int(want)
}

// readyWatch follows the Service's EndpointSlices and the Deployment's
// status from before the first eviction to the end of the rollout and
// records the fewest ready endpoints and ready replicas it saw.
type readyWatch struct {
	mu         sync.Mutex
	slices     map[string]int // ready endpoints per EndpointSlice
	minEndpts  int
	minReplica int32
	events     int
	// odd are events that were neither of the watched kinds (watch
	// errors), kept for the failure message.
	odd    []string
	cancel context.CancelFunc
	done   sync.WaitGroup
}

func watchReady(t *testing.T, c kubernetes.Interface, ns string) *readyWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &readyWatch{slices: map[string]int{}, minEndpts: 1 << 30, minReplica: 1 << 30, cancel: cancel}
	// ResourceVersion "0": from the watch cache, starting with the current
	// objects. Without it the API server asks etcd for a consistent
	// revision, which Debian's etcd 3.4 (no progress requests) answers
	// late: "Too large resource version", and the watch ends at once.
	sel := metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=steward-trustd", ResourceVersion: "0"}
	es, err := c.DiscoveryV1().EndpointSlices(ns).Watch(ctx, sel)
	check(t, err)
	dep, err := c.AppsV1().Deployments(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=steward-trustd", ResourceVersion: "0"})
	check(t, err)
	w.done.Add(2)
	go w.follow(ctx, es, w.endpointSlice)
	go w.follow(ctx, dep, w.deployment)
	return w
}

// follow records wi's events until ctx ends; a watch the server ends
// earlier is recorded as odd (the test would have seen nothing after it).
func (w *readyWatch) follow(ctx context.Context, wi watch.Interface, record func(watch.Event)) {
	defer w.done.Done()
	defer wi.Stop()
	defer func() {
		if ctx.Err() == nil {
			w.mu.Lock()
			w.odd = append(w.odd, "a watch ended early")
			w.mu.Unlock()
		}
	}()
	for ev := range wi.ResultChan() {
		if ctx.Err() != nil {
			return // stop cancelled the watch: what follows is its error
		}
		w.mu.Lock()
		w.events++
		switch ev.Object.(type) {
		case *discoveryv1.EndpointSlice, *appsv1.Deployment:
			record(ev)
		default:
			w.odd = append(w.odd, fmt.Sprintf("%s %+v", ev.Type, ev.Object))
		}
		w.mu.Unlock()
	}
}

func (w *readyWatch) endpointSlice(ev watch.Event) {
	s := ev.Object.(*discoveryv1.EndpointSlice)
	n := 0
	for _, ep := range s.Endpoints {
		if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
			n++
		}
	}
	if ev.Type == watch.Deleted {
		n = 0
	}
	w.slices[s.Name] = n
	total := 0
	for _, v := range w.slices {
		total += v
	}
	w.minEndpts = min(w.minEndpts, total)
}

func (w *readyWatch) deployment(ev watch.Event) {
	w.minReplica = min(w.minReplica, ev.Object.(*appsv1.Deployment).Status.ReadyReplicas)
}

// stop ends the watches and fails unless they saw events and never zero
// ready endpoints or replicas.
func (w *readyWatch) stop(t *testing.T) {
	t.Helper()
	w.cancel()
	w.done.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	summary := fmt.Sprintf("%d watch events; fewest ready endpoints %d, fewest ready replicas %d; other events %v", w.events, w.minEndpts, w.minReplica, w.odd)
	if len(w.odd) > 0 || w.events == 0 || w.minEndpts < 1 || w.minReplica < 1 || w.minEndpts == 1<<30 || w.minReplica == 1<<30 {
		t.Fatalf("through the eviction and the rollout: %s; want at least 1 of each throughout", summary)
	}
	t.Log("through the eviction and the rollout: " + summary)
}
