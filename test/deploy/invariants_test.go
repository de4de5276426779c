package deploy

import (
	"net"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/steward-trustd/steward-trustd/signer/file"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
)

// overlay is one shipped backend overlay and the files its key URI needs
// (each must lie in a mounted volume).
type overlay struct {
	dir   string
	files func(t *testing.T, uri string) []string
	extra func(t *testing.T, pod *corev1.PodSpec, c *corev1.Container)
}

var overlays = []overlay{
	{"overlays/file", fileKeyFiles, nil},
	{"overlays/tpm", tpmKeyFiles, checkTPMPod},
	{"overlays/pkcs11", pkcs11KeyFiles, checkPKCS11Pod},
}

func fileKeyFiles(t *testing.T, uri string) []string {
	p, err := file.ParseURI(uri)
	if err != nil {
		t.Fatalf("TRUSTD_SIGNER %q: %v", uri, err)
	}
	return []string{p}
}

func tpmKeyFiles(t *testing.T, uri string) []string {
	u, err := tpm.ParseURI(uri)
	if err != nil {
		t.Fatalf("TRUSTD_SIGNER %q: %v", uri, err)
	}
	if u.Path == "" {
		t.Fatalf("TRUSTD_SIGNER %q: want a key blob path (a persistent handle is not portable to a pod)", uri)
	}
	return []string{u.Path}
}

func pkcs11KeyFiles(t *testing.T, uri string) []string {
	u, err := pkcs11.ParseURI(uri)
	if err != nil {
		t.Fatalf("TRUSTD_SIGNER %q: %v", uri, err)
	}
	if u.PINSource == "" {
		t.Fatalf("TRUSTD_SIGNER %q: want pin-source=file: (a PIN in the URI is in every pod listing)", uri)
	}
	return []string{u.ModulePath, u.PINSource}
}

// checkTPMPod: /dev/tpmrm0 from the device plugin, pinned to the TPM's node.
func checkTPMPod(t *testing.T, pod *corev1.PodSpec, c *corev1.Container) {
	want := resource.MustParse("1")
	if q := c.Resources.Limits["squat.ai/tpmrm"]; q.Cmp(want) != 0 {
		t.Errorf("limits[squat.ai/tpmrm] = %v, want 1", q.String())
	}
	if pod.NodeSelector["kubernetes.io/hostname"] == "" {
		t.Error("the TPM key blob loads only on the node that made it: want a kubernetes.io/hostname nodeSelector")
	}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			t.Errorf("volume %s is a hostPath: the device plugin provides /dev/tpmrm0", v.Name)
		}
	}
}

// checkPKCS11Pod: the module is a read-only volume whose directory is on
// the loader's path (for the module's own libraries), the PIN a Secret.
func checkPKCS11Pod(t *testing.T, pod *corev1.PodSpec, c *corev1.Container) {
	u, err := pkcs11.ParseURI(env(c, "TRUSTD_SIGNER"))
	if err != nil {
		t.Fatal(err)
	}
	if got := env(c, "LD_LIBRARY_PATH"); got != filepath.Dir(u.ModulePath) {
		t.Errorf("LD_LIBRARY_PATH = %q, want the module's directory %s", got, filepath.Dir(u.ModulePath))
	}
	for _, want := range []string{"hsm-module", "hsm-pin"} {
		m := mountNamed(c, want)
		if m == nil || !m.ReadOnly {
			t.Errorf("want a read-only mount of volume %s, got %+v", want, m)
		}
	}
}

func mountNamed(c *corev1.Container, name string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == name {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func env(c *corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func TestOverlaysStartAsShipped(t *testing.T) {
	for _, o := range overlays {
		t.Run(o.dir, func(t *testing.T) {
			objs := render(t, o.dir)
			d := only[*appsv1.Deployment](t, objs)
			pod := &d.Spec.Template.Spec
			if len(pod.Containers) != 1 {
				t.Fatalf("want one container, got %d", len(pod.Containers))
			}
			c := &pod.Containers[0]
			checkReplicas(t, d)
			checkImage(t, c.Image)
			checkSecurity(t, pod, c)
			checkProbes(t, c)
			checkResources(t, c)
			checkSettings(t, c)
			uri := env(c, "TRUSTD_SIGNER")
			if uri == "" {
				t.Fatal("TRUSTD_SIGNER is not set: the daemon would look for a file key that a ceremony Secret does not have")
			}
			for _, f := range o.files(t, uri) {
				checkMounted(t, pod, c, f)
			}
			checkSecretVolumes(t, pod)
			checkService(t, only[*corev1.Service](t, objs), c)
			checkNetworkPolicy(t, only[*networkingv1.NetworkPolicy](t, objs), c)
			if o.extra != nil {
				o.extra(t, pod, c)
			}
		})
	}
}

func checkReplicas(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 { // explicit, not defaulted
		t.Errorf("replicas = %d: one key must not be shared by several pods (the HA layout comes with the tiered CA)", replicas(d))
	}
	if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("strategy %q: a rolling update would run two pods on one key", d.Spec.Strategy.Type)
	}
}

func replicas(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas == nil {
		return 1 // the API server's default
	}
	return *d.Spec.Replicas
}

// checkImage: a pinned tag or digest, never latest.
func checkImage(t *testing.T, image string) {
	t.Helper()
	name, digest, hasDigest := strings.Cut(image, "@")
	repo, tag := name, ""
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		repo, tag = name[:i], name[i+1:]
	}
	if !strings.Contains(strings.SplitN(repo, "/", 2)[0], ".") {
		t.Errorf("image %q is not fully qualified (registry host first)", image)
	}
	if hasDigest && !strings.HasPrefix(digest, "sha256:") || !hasDigest && (tag == "" || tag == "latest") {
		t.Errorf("image %q: pin a tag or digest, never latest", image)
	}
}

func checkSecurity(t *testing.T, pod *corev1.PodSpec, c *corev1.Container) {
	t.Helper()
	ps := pod.SecurityContext
	if ps == nil || c.SecurityContext == nil {
		t.Fatal("pod and container securityContext must be set")
	}
	if ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser == 0 {
		t.Error("want runAsNonRoot and a non-zero runAsUser")
	}
	if ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("want seccompProfile RuntimeDefault")
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken || pod.HostNetwork || pod.HostPID {
		t.Error("want no service-account token, no host network or PID namespace")
	}
	checkContainerSecurity(t, c.SecurityContext)
}

// checkContainerSecurity: read-only root, no privilege, no capability.
func checkContainerSecurity(t *testing.T, cs *corev1.SecurityContext) {
	t.Helper()
	if cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem {
		t.Error("want readOnlyRootFilesystem")
	}
	if cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation || cs.Privileged != nil && *cs.Privileged {
		t.Error("want allowPrivilegeEscalation: false and not privileged")
	}
	if cs.Capabilities == nil || len(cs.Capabilities.Drop) != 1 || cs.Capabilities.Drop[0] != "ALL" || len(cs.Capabilities.Add) != 0 {
		t.Errorf("want capabilities drop [ALL], add none; got %+v", cs.Capabilities)
	}
}

// checkProbes: readiness on /readyz, liveness on /healthz, both on the
// port TRUSTD_HEALTH_ADDR listens on.
func checkProbes(t *testing.T, c *corev1.Container) {
	t.Helper()
	_, port, err := net.SplitHostPort(env(c, "TRUSTD_HEALTH_ADDR"))
	if err != nil {
		t.Fatalf("TRUSTD_HEALTH_ADDR: %v (probes need the health endpoint)", err)
	}
	for name, want := range map[string]struct {
		p    *corev1.Probe
		path string
	}{"readiness": {c.ReadinessProbe, "/readyz"}, "liveness": {c.LivenessProbe, "/healthz"}} {
		if want.p == nil || want.p.HTTPGet == nil || want.p.HTTPGet.Path != want.path {
			t.Errorf("%s probe: want HTTP GET %s", name, want.path)
			continue
		}
		if got := containerPort(c, want.p.HTTPGet.Port.String()); got != port {
			t.Errorf("%s probe on port %s (%q), TRUSTD_HEALTH_ADDR listens on %s", name, got, want.p.HTTPGet.Port.String(), port)
		}
	}
}

// containerPort resolves a named or numeric port of c.
func containerPort(c *corev1.Container, p string) string {
	for _, cp := range c.Ports {
		if cp.Name == p {
			return resource.NewQuantity(int64(cp.ContainerPort), resource.DecimalSI).String()
		}
	}
	return p
}

func checkResources(t *testing.T, c *corev1.Container) {
	t.Helper()
	r := c.Resources
	if r.Requests.Cpu().IsZero() || r.Requests.Memory().IsZero() || r.Limits.Memory().IsZero() {
		t.Errorf("want cpu and memory requests and a memory limit, got %+v", r)
	}
}

// checkSettings: the serving certificate names what workers dial, and the
// port is the one workers always use.
func checkSettings(t *testing.T, c *corev1.Container) {
	t.Helper()
	if env(c, "TRUSTD_CERT_SANS") == "" {
		t.Error("TRUSTD_CERT_SANS is empty: the self-issued certificate would name only pod addresses, which workers do not dial")
	}
	if containerPort(c, "trustd") != "50001" {
		t.Error("want container port trustd = 50001 (workers always dial 50001)")
	}
}

// checkMounted: path lies inside a volume mounted into c.
func checkMounted(t *testing.T, pod *corev1.PodSpec, c *corev1.Container, path string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if rel, err := filepath.Rel(m.MountPath, path); err == nil && !strings.HasPrefix(rel, "..") && rel != "." {
			if !volumeExists(pod, m.Name) {
				t.Errorf("mount %s names no volume", m.Name)
			}
			return
		}
	}
	t.Errorf("%s (from TRUSTD_SIGNER) is in no mounted volume", path)
}

func volumeExists(pod *corev1.PodSpec, name string) bool {
	for _, v := range pod.Volumes {
		if v.Name == name {
			return true
		}
	}
	return false
}

// checkSecretVolumes: kubelet makes Secret files root:fsGroup; fsGroup must
// be the daemon's group (so it can read them) and the mode owner + group
// read only, which is exactly what the file signer accepts on a Secret
// mount (signer/file/secretmount.go).
func checkSecretVolumes(t *testing.T, pod *corev1.PodSpec) {
	t.Helper()
	ps := pod.SecurityContext
	if ps.FSGroup == nil || ps.RunAsGroup == nil || *ps.FSGroup != *ps.RunAsGroup {
		t.Fatalf("want fsGroup = runAsGroup so the daemon can read its Secrets, got %v / %v", ps.FSGroup, ps.RunAsGroup)
	}
	for _, v := range pod.Volumes {
		if v.Secret == nil {
			continue
		}
		if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode != 0o440 {
			t.Errorf("Secret volume %s: want defaultMode 0440 (what fsGroup makes of 0400 anyway)", v.Name)
		}
	}
	if !volumeExists(pod, "certs") {
		t.Error("no certs volume")
	}
}

func checkService(t *testing.T, s *corev1.Service, c *corev1.Container) {
	t.Helper()
	if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Port != 50001 || containerPort(c, s.Spec.Ports[0].TargetPort.String()) != "50001" {
		t.Errorf("Service must expose 50001 to the container's trustd port, got %+v", s.Spec.Ports)
	}
	if s.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
		t.Error("want externalTrafficPolicy Local (keeps workers' addresses for TRUSTD_REQUIRE_PEER_IP)")
	}
}

func checkNetworkPolicy(t *testing.T, np *networkingv1.NetworkPolicy, c *corev1.Container) {
	t.Helper()
	open := map[string]bool{}
	for _, r := range np.Spec.Ingress {
		for _, p := range r.Ports {
			open[p.Port.String()] = true
		}
	}
	_, health, _ := net.SplitHostPort(env(c, "TRUSTD_HEALTH_ADDR"))
	if !open["50001"] || !open[health] || len(np.Spec.Egress) != 0 {
		t.Errorf("NetworkPolicy: want ingress on 50001 and %s, no egress; got ingress ports %v, %d egress rules", health, open, len(np.Spec.Egress))
	}
}
