package deploy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// renderWithAuthorizer renders overlays/file with components/authorizer,
// as an operator's overlay would include it.
func renderWithAuthorizer(t *testing.T) []runtime.Object {
	t.Helper()
	abs, err := filepath.Abs(manifests)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, abs)
	if err != nil {
		t.Fatal(err)
	}
	kust := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " + filepath.Join(rel, "overlays", "file") +
		"\ncomponents:\n  - " + filepath.Join(rel, "components", "authorizer") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kust), 0o600); err != nil {
		t.Fatal(err)
	}
	back, err := filepath.Rel(abs, dir)
	if err != nil {
		t.Fatal(err)
	}
	return render(t, back)
}

// TestAuthorizerComponent: only the authorizer container holds API
// credentials (the pod mounts no token; a projected token volume goes to
// the authorizer alone), the daemon and the authorizer share the socket
// directory, and the role is read-only on nodes and machines.
func TestAuthorizerComponent(t *testing.T) {
	objs := renderWithAuthorizer(t)
	dep := only[*appsv1.Deployment](t, objs)
	pod := dep.Spec.Template.Spec
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the pod mounts its ServiceAccount token into every container")
	}
	trustd, authorizer := container(t, pod, "trustd"), container(t, pod, "authorizer")
	tokenVolume := projectedTokenVolume(t, pod)
	if mountOf(trustd, tokenVolume) != "" {
		t.Errorf("the trustd container mounts the API token volume %s", tokenVolume)
	}
	if mountOf(authorizer, tokenVolume) != "/var/run/secrets/kubernetes.io/serviceaccount" {
		t.Errorf("the authorizer's token is not at the in-cluster path: %q", mountOf(authorizer, tokenVolume))
	}
	sock := env(&trustd, "TRUSTD_AUTHORIZER")
	if !strings.HasPrefix(sock, "unix://") || !slices.Contains(authorizer.Args, "--listen="+sock) {
		t.Errorf("TRUSTD_AUTHORIZER %q is not where the authorizer listens (%v)", sock, authorizer.Args)
	}
	dirOf := filepath.Dir(strings.TrimPrefix(sock, "unix://"))
	if mountOf(trustd, "authorizer-socket") != dirOf || mountOf(authorizer, "authorizer-socket") != dirOf {
		t.Errorf("the socket directory %s is not the shared emptyDir in both containers", dirOf)
	}
	if env(&trustd, "TRUSTD_AUTHORIZER_MODE") != "enforce" {
		t.Error("the component does not enforce")
	}
	checkAuthorizerRole(t, objs, dep.Namespace, pod.ServiceAccountName)
}

func checkAuthorizerRole(t *testing.T, objs []runtime.Object, ns, sa string) {
	t.Helper()
	role := only[*rbacv1.ClusterRole](t, objs)
	for _, r := range role.Rules {
		if !slices.Equal(r.Verbs, []string{"get", "list", "watch"}) {
			t.Errorf("rule %v grants %v: read-only get/list/watch only", r.Resources, r.Verbs)
		}
		if !slices.Equal(r.Resources, []string{"nodes"}) && !slices.Equal(r.Resources, []string{"machines"}) {
			t.Errorf("rule grants %v: nodes and machines only", r.Resources)
		}
	}
	b := only[*rbacv1.ClusterRoleBinding](t, objs)
	if len(b.Subjects) != 1 || b.Subjects[0].Name != sa || b.Subjects[0].Namespace != ns || b.RoleRef.Name != role.Name {
		t.Errorf("binding %+v does not give %s/%s the role %s", b.Subjects, ns, sa, role.Name)
	}
	for _, o := range objs {
		if s, ok := o.(*corev1.ServiceAccount); ok && s.Name == sa && (s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken) {
			t.Errorf("ServiceAccount %s automounts its token", sa)
		}
	}
}

func container(t *testing.T, pod corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range pod.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

// projectedTokenVolume is the one volume that carries a ServiceAccount token.
func projectedTokenVolume(t *testing.T, pod corev1.PodSpec) string {
	t.Helper()
	var names []string
	for _, v := range pod.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.ServiceAccountToken != nil {
				names = append(names, v.Name)
			}
		}
	}
	if len(names) != 1 {
		t.Fatalf("want one projected token volume, got %v", names)
	}
	return names[0]
}

func mountOf(c corev1.Container, volume string) string {
	if m := mountNamed(&c, volume); m != nil {
		return m.MountPath
	}
	return ""
}
