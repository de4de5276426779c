package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/steward-trustd/steward-trustd/internal/authz"
	"github.com/steward-trustd/steward-trustd/internal/inventory"
)

// machineGVR is Cluster API's Machine, read without its Go types.
func machineGVR(version string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: version, Resource: "machines"}
}

// resync is the informers' full resync: a missed event heals this late.
const resync = 10 * time.Minute

// kubeConfig is in-cluster credentials, or the kubeconfig file given.
func kubeConfig(path string) (*rest.Config, error) {
	if path == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster credentials: %w (outside a pod pass --kubeconfig)", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return cfg, nil
}

// kubeSources runs the Node and Machine informers and reports their
// listings to the combined inventory on every change.
type kubeSources struct {
	cfg       *rest.Config
	selector  string
	namespace string
	version   string // Machine API version
	combined  *inventory.Combined
	log       *slog.Logger
}

// startNodes starts a Node informer; it returns once the cache synced.
func (k *kubeSources) startNodes(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(k.cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	f := informers.NewSharedInformerFactoryWithOptions(cs, resync, informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = k.selector }))
	inf := f.Core().V1().Nodes()
	lister := inf.Lister()
	push := func() {
		nodes, err := lister.List(labels.Everything())
		if err != nil {
			k.log.Error("list nodes from the cache", "error", err)
			return
		}
		k.report("nodes", nodeEntries(nodes))
	}
	return k.run(ctx, inf.Informer(), f.Start, push, "nodes")
}

// startMachines starts a dynamic Machine informer in the namespace ("" all).
func (k *kubeSources) startMachines(ctx context.Context) error {
	dc, err := dynamic.NewForConfig(k.cfg)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dc, resync, k.namespace, func(o *metav1.ListOptions) { o.LabelSelector = k.selector })
	gi := f.ForResource(machineGVR(k.version))
	push := func() {
		objs, err := gi.Lister().List(labels.Everything())
		if err != nil {
			k.log.Error("list machines from the cache", "error", err)
			return
		}
		entries := make([]inventory.Entry, 0, len(objs))
		for _, o := range objs {
			if u, ok := o.(*unstructured.Unstructured); ok {
				entries = append(entries, machineEntry(u))
			}
		}
		k.report("machines", entries)
	}
	return k.run(ctx, gi.Informer(), f.Start, push, "machines")
}

// run registers push on every event, starts the informer and waits for
// its first listing (bounded by ctx).
func (k *kubeSources) run(ctx context.Context, inf cache.SharedIndexInformer, start func(<-chan struct{}), push func(), what string) error {
	var synced atomic.Bool
	h := func() {
		if synced.Load() {
			push()
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { h() }, UpdateFunc: func(any, any) { h() }, DeleteFunc: func(any) { h() },
	}); err != nil {
		return fmt.Errorf("%s informer: %w", what, err)
	}
	start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("%s: the informer did not sync (check the API server address, the credentials and RBAC: get/list/watch on %s)", what, what)
	}
	synced.Store(true)
	push()
	return nil
}

func (k *kubeSources) report(source string, entries []inventory.Entry) {
	if err := k.combined.Update(source, entries); err != nil {
		k.log.Error("inventory update refused; the last good one stays in force", "source", source, "error", err)
	}
}

// nodeEntries turns Nodes into machines: InternalIP/ExternalIP are its
// addresses, Hostname and the DNS types its names.
func nodeEntries(nodes []*corev1.Node) []inventory.Entry {
	out := make([]inventory.Entry, 0, len(nodes))
	for _, n := range nodes {
		m := authz.Machine{Name: n.Name, UUID: n.Status.NodeInfo.SystemUUID, Created: n.CreationTimestamp.Time}
		for _, a := range n.Status.Addresses {
			addAddress(&m, string(a.Type), a.Address)
		}
		out = append(out, inventory.Entry{Key: n.Name, Machine: m})
	}
	return out
}

// machineEntry turns a Cluster API Machine into a machine merged under
// its Node's name (status.nodeRef.name) once it has one.
func machineEntry(u *unstructured.Unstructured) inventory.Entry {
	m := authz.Machine{Name: u.GetName(), Created: u.GetCreationTimestamp().Time}
	m.UUID, _, _ = unstructured.NestedString(u.Object, "spec", "providerID")
	addrs, _, _ := unstructured.NestedSlice(u.Object, "status", "addresses")
	for _, a := range addrs {
		am, ok := a.(map[string]any)
		if !ok {
			continue
		}
		typ, _ := am["type"].(string)
		addr, _ := am["address"].(string)
		addAddress(&m, typ, addr)
	}
	key := u.GetName()
	if node, _, _ := unstructured.NestedString(u.Object, "status", "nodeRef", "name"); node != "" {
		key = node
	}
	return inventory.Entry{Key: key, Machine: m}
}

// addAddress files one Kubernetes address (NodeAddress or CAPI
// MachineAddress, the same types) into m.
func addAddress(m *authz.Machine, typ, addr string) {
	switch typ {
	case "InternalIP", "ExternalIP":
		if a, err := netip.ParseAddr(addr); err == nil && a.Zone() == "" {
			m.Addresses = append(m.Addresses, a.Unmap())
		}
	case "Hostname", "InternalDNS", "ExternalDNS":
		if addr != "" {
			m.Hostnames = append(m.Hostnames, addr)
		}
	}
}
