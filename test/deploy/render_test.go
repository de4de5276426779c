// Package deploy checks the shipped Kubernetes manifests: every kustomize
// overlay renders with kustomize's own Go API, every object decodes
// strictly into the Kubernetes API types (an unknown or duplicate field is
// an error, as the API server's strict field validation makes it), and the
// rendered Deployment starts as shipped: signer set and pointing into a
// mounted volume, probes on the health port, non-root, read-only root,
// resources requested, one replica. It is a separate module so kustomize
// and k8s.io never enter the daemon's module graph.
package deploy

import (
	"fmt"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// manifests is deploy/kubernetes relative to this package.
var manifests = filepath.Join("..", "..", "deploy", "kubernetes")

// render runs kustomize on dir (relative to deploy/kubernetes) and
// strictly decodes every object it emits.
func render(t *testing.T, dir string) []runtime.Object {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(manifests, dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	dec := strictDecoder(t)
	var objs []runtime.Object
	for _, r := range rm.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			t.Fatalf("%s: %s: %v", dir, r.CurId(), err)
		}
		obj, _, err := dec.Decode(y, nil, nil)
		if err != nil {
			t.Fatalf("%s: %s does not decode strictly into the Kubernetes API types: %v", dir, r.CurId(), err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// strictDecoder decodes the API groups the manifests use; strict mode
// makes unknown and duplicate fields errors.
func strictDecoder(t *testing.T) runtime.Decoder {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, networkingv1.AddToScheme, policyv1.AddToScheme, rbacv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}

// only returns the single object of type T in objs.
func only[T runtime.Object](t *testing.T, objs []runtime.Object) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want exactly one %T, got %d", zero, len(found))
	}
	return found[0]
}

func TestStrictDecoderRefusesUnknownFields(t *testing.T) {
	y := []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 2\n")
	if _, _, err := strictDecoder(t).Decode(y, nil, nil); err == nil {
		t.Fatal("a misspelt field (replica) decoded without error: the decoder is not strict")
	}
}

func TestRenderEveryKustomization(t *testing.T) {
	for _, dir := range []string{"base", "overlays/file", "overlays/tpm", "overlays/pkcs11", "overlays/ha-tpm", "overlays/ha-pkcs11", "tpm-device-plugin"} {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			if len(objs) == 0 {
				t.Fatal("renders nothing")
			}
			for _, o := range objs {
				if ns := o.(interface{ GetNamespace() string }).GetNamespace(); ns == "" && fmt.Sprintf("%T", o) != "*v1.Namespace" {
					t.Errorf("%T has no namespace", o)
				}
			}
		})
	}
}
