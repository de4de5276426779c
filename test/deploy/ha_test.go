package deploy

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// haOverlays are the replicated layouts: each pod must find its own key
// (and chain) by node name, or share one clustered HSM key.
var haOverlays = []overlay{
	{"overlays/ha-tpm", tpmKeyFiles, checkHATPMPod},
	{"overlays/ha-pkcs11", pkcs11KeyFiles, checkPKCS11Pod},
}

// sampleNode stands for $(NODE_NAME) when paths are checked.
const sampleNode = "node-a"

func TestHAOverlays(t *testing.T) {
	for _, o := range haOverlays {
		t.Run(o.dir, func(t *testing.T) {
			objs := render(t, o.dir)
			d := only[*appsv1.Deployment](t, objs)
			pod := &d.Spec.Template.Spec
			c := &pod.Containers[0]
			checkImage(t, c.Image)
			checkSecurity(t, pod, c)
			checkProbes(t, c)
			checkResources(t, c)
			checkSettings(t, c)
			checkSecretVolumes(t, pod)
			checkService(t, only[*corev1.Service](t, objs), c)
			checkNetworkPolicy(t, only[*networkingv1.NetworkPolicy](t, objs), c)
			checkSpread(t, d)
			checkPDB(t, only[*policyv1.PodDisruptionBudget](t, objs), d.Spec.Template.Labels)
			checkNodeEnv(t, c)
			for _, f := range o.files(t, expandNode(env(c, "TRUSTD_SIGNER"))) {
				checkMounted(t, pod, c, f)
			}
			if f := env(c, "TRUSTD_ISSUER_CRT_FILE"); f != "" {
				checkMounted(t, pod, c, expandNode(f))
			}
			o.extra(t, pod, c)
		})
	}
}

// checkHATPMPod: /dev/tpmrm0 from the device plugin (which also keeps
// pods off nodes without a TPM), no node pinning (each node has its own
// blob), no hostPath.
func checkHATPMPod(t *testing.T, pod *corev1.PodSpec, c *corev1.Container) {
	t.Helper()
	if q := c.Resources.Limits["squat.ai/tpmrm"]; q.String() != "1" {
		t.Errorf("limits[squat.ai/tpmrm] = %v, want 1", q.String())
	}
	if pod.NodeSelector["kubernetes.io/hostname"] != "" {
		t.Error("a hostname nodeSelector pins every replica to one node")
	}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			t.Errorf("volume %s is a hostPath: the device plugin provides /dev/tpmrm0", v.Name)
		}
	}
}

func expandNode(s string) string { return strings.ReplaceAll(s, "$(NODE_NAME)", sampleNode) }

// checkSpread: several replicas, never two on one node, replaced one at a
// time without surge (a TPM node has one device).
func checkSpread(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	if replicas(d) < 2 {
		t.Errorf("replicas = %d: the HA layout runs several", replicas(d))
	}
	s := d.Spec.Strategy
	if s.Type != appsv1.RollingUpdateDeploymentStrategyType || s.RollingUpdate == nil ||
		s.RollingUpdate.MaxSurge.String() != "0" || s.RollingUpdate.MaxUnavailable.String() != "1" {
		t.Errorf("strategy %+v: want RollingUpdate, maxSurge 0, maxUnavailable 1", s)
	}
	pod := d.Spec.Template.Spec
	a := pod.Affinity
	if a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Fatal("want a required pod anti-affinity")
	}
	term := a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0]
	sel := labels.SelectorFromSet(term.LabelSelector.MatchLabels)
	if term.TopologyKey != "kubernetes.io/hostname" || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("anti-affinity %+v does not keep this Deployment's pods on distinct nodes", term)
	}
	if len(pod.TopologySpreadConstraints) == 0 {
		t.Error("want a topology spread constraint")
	}
}

// checkPDB: one replica down at a time, over exactly these pods.
func checkPDB(t *testing.T, pdb *policyv1.PodDisruptionBudget, podLabels map[string]string) {
	t.Helper()
	if pdb.Spec.MaxUnavailable == nil || *pdb.Spec.MaxUnavailable != intstr.FromInt32(1) || pdb.Spec.MinAvailable != nil {
		t.Errorf("PDB: want maxUnavailable 1, got %+v", pdb.Spec)
	}
	if pdb.Spec.Selector == nil || !labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels).Matches(labels.Set(podLabels)) {
		t.Error("PDB selects no pod of the Deployment")
	}
}

// checkNodeEnv: NODE_NAME comes from spec.nodeName and is defined before
// any variable that expands it (Kubernetes expands $(VAR) only from
// earlier entries; a later one stays literal).
func checkNodeEnv(t *testing.T, c *corev1.Container) {
	t.Helper()
	defined := false
	for _, e := range c.Env {
		if e.Name == "NODE_NAME" {
			defined = e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
			if !defined {
				t.Error("NODE_NAME must come from the downward API (spec.nodeName)")
			}
		}
		if strings.Contains(e.Value, "$(NODE_NAME)") && !defined {
			t.Errorf("%s uses $(NODE_NAME) before it is defined", e.Name)
		}
	}
}

// kamajiTCP is the part of Kamaji's TenantControlPlane (clastix/kamaji
// api/v1alpha1 tenantcontrolplane_types.go) the sidecar layout sets,
// transcribed with Kamaji's JSON names; strict decoding into it catches a
// misspelt field, and the Kubernetes types inside are the real ones.
type kamajiTCP struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		ControlPlane struct {
			Deployment struct {
				Replicas              *int32 `json:"replicas"`
				PodAdditionalMetadata struct {
					Labels map[string]string `json:"labels"`
				} `json:"podAdditionalMetadata"`
				Strategy                  appsv1.DeploymentStrategy         `json:"strategy"`
				TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints"`
				AdditionalContainers      []corev1.Container                `json:"additionalContainers"`
				AdditionalVolumes         []corev1.Volume                   `json:"additionalVolumes"`
			} `json:"deployment"`
			Service struct {
				ServiceType     string `json:"serviceType"`
				AdditionalPorts []struct {
					Name       string             `json:"name"`
					Protocol   corev1.Protocol    `json:"protocol"`
					Port       int32              `json:"port"`
					TargetPort intstr.IntOrString `json:"targetPort"`
				} `json:"additionalPorts"`
			} `json:"service"`
		} `json:"controlPlane"`
		Kubernetes struct {
			Version string `json:"version"`
			// Kubelet is required by Kamaji's CRD (spec.kubernetes.kubelet).
			Kubelet *struct {
				PreferredAddressTypes []string `json:"preferredAddressTypes"`
				CGroupFS              string   `json:"cgroupfs"`
			} `json:"kubelet"`
		} `json:"kubernetes"`
		NetworkProfile struct {
			Port int32 `json:"port"`
		} `json:"networkProfile"`
	} `json:"spec"`
}

// renderKamaji builds deploy/kubernetes/kamaji: the TenantControlPlane
// strictly into kamajiTCP, everything else as render does.
func renderKamaji(t *testing.T) (*kamajiTCP, *policyv1.PodDisruptionBudget) {
	t.Helper()
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(manifests, "kamaji"))
	if err != nil {
		t.Fatal(err)
	}
	var tcp *kamajiTCP
	var pdb *policyv1.PodDisruptionBudget
	for _, r := range rm.Resources() {
		j, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		switch r.GetKind() {
		case "TenantControlPlane":
			tcp = &kamajiTCP{}
			dec := json.NewDecoder(bytes.NewReader(j))
			dec.DisallowUnknownFields()
			if err := dec.Decode(tcp); err != nil {
				t.Fatalf("TenantControlPlane: %v", err)
			}
		case "PodDisruptionBudget":
			y, _ := r.AsYAML()
			obj, _, err := strictDecoder(t).Decode(y, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			pdb = obj.(*policyv1.PodDisruptionBudget)
		default:
			t.Errorf("unexpected %s in the kamaji layout", r.GetKind())
		}
	}
	if tcp == nil || pdb == nil {
		t.Fatal("want a TenantControlPlane and a PodDisruptionBudget")
	}
	return tcp, pdb
}

// TestKamajiSidecar: trustd as a sidecar of the tenant's control-plane
// pods, its port on the TCP Service, a TPM per pod, spread over nodes.
func TestKamajiSidecar(t *testing.T) {
	tcp, pdb := renderKamaji(t)
	dep := tcp.Spec.ControlPlane.Deployment
	if len(dep.AdditionalContainers) != 1 || dep.Replicas == nil || *dep.Replicas < 2 {
		t.Fatalf("want one trustd sidecar and several replicas")
	}
	c := &dep.AdditionalContainers[0]
	pod := &corev1.PodSpec{Containers: []corev1.Container{*c}, Volumes: dep.AdditionalVolumes}
	checkImage(t, c.Image)
	checkContainerSecurity(t, c.SecurityContext)
	checkProbes(t, c)
	checkResources(t, c)
	checkSettings(t, c)
	checkNodeEnv(t, c)
	for _, f := range tpmKeyFiles(t, expandNode(env(c, "TRUSTD_SIGNER"))) {
		checkMounted(t, pod, c, f)
	}
	checkMounted(t, pod, c, expandNode(env(c, "TRUSTD_ISSUER_CRT_FILE")))
	checkMounted(t, pod, c, filepath.Join(env(c, "TRUSTD_CERT_DIR"), "os-ca.crt"))
	checkHATPMPod(t, pod, c)
	if s := dep.Strategy; s.RollingUpdate == nil || s.RollingUpdate.MaxSurge.String() != "0" {
		t.Error("want maxSurge 0: Kamaji's default 100% surge needs spare TPM nodes")
	}
	if len(dep.TopologySpreadConstraints) == 0 || dep.TopologySpreadConstraints[0].TopologyKey != "kubernetes.io/hostname" {
		t.Error("want the replicas spread over nodes")
	}
	ports := tcp.Spec.ControlPlane.Service.AdditionalPorts
	if len(ports) != 1 || ports[0].Port != 50001 || containerPort(c, ports[0].TargetPort.String()) != "50001" {
		t.Errorf("the TCP Service must expose 50001 to the sidecar: %+v", ports)
	}
	checkPDB(t, pdb, dep.PodAdditionalMetadata.Labels)
	if tcp.Spec.Kubernetes.Kubelet == nil || tcp.Spec.Kubernetes.Version == "" {
		t.Error("Kamaji's CRD requires spec.kubernetes.version and spec.kubernetes.kubelet")
	}
	if pdb.Namespace != tcp.Metadata.Namespace {
		t.Errorf("PDB in %q, TenantControlPlane in %q", pdb.Namespace, tcp.Metadata.Namespace)
	}
}
