package k8s

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// pkcs11Layout: overlays/pkcs11 as shipped, SoftHSMv2 standing in as the
// vendor's module: Debian's libsofthsm2.so as lib/libvendor.so with its
// libcrypto, config and token in a module image (hack/e2e-node.sh's
// hsm_module), mounted by the overlay's own image volume; the ceremony
// Secret and the PIN Secret made as the overlay's recipe says.
func (e *nodeEnv) pkcs11Layout(t *testing.T) {
	s := site{overlay: "overlays/pkcs11", namespace: "e2e-pkcs11", serviceIP: "10.0.0.51", patches: e.hsmPatches()}
	ns := e.deploy(t, s, e.hsmSecrets(t)...)
	e.served(t, ns, s.serviceIP, filepath.Join(e.hsm, "certs"), 1)
	e.checkPodLog(t, ns)
}

// hsmPatches are the pkcs11 overlays' site values for this module: the
// client image (hsm-module volume) and the module's own configuration
// file, which SoftHSM finds through SOFTHSM2_CONF (a vendor module's
// setting, like a network HSM's client configuration).
func (e *nodeEnv) hsmPatches() string {
	return podSpecPatch(fmt.Sprintf(`            containers:
              - name: trustd
                env:
                  - {name: SOFTHSM2_CONF, value: /opt/hsm/etc/softhsm2.conf}
            volumes:
              - name: hsm-module
                image: {reference: %q}
`, e.hsmImage))
}

// hsmSecrets are the ceremony's kubernetes-secret.yaml and the PIN
// Secret (kubectl create secret generic steward-trustd-hsm-pin
// --from-file=pin=..., as the overlay's recipe does).
func (e *nodeEnv) hsmSecrets(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	pin, err := os.ReadFile(filepath.Join(e.hsm, "pin"))
	check(t, err)
	pinSecret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": "steward-trustd-hsm-pin"},
		"data":     map[string]any{"pin": base64.StdEncoding.EncodeToString(pin)}}}
	return []*unstructured.Unstructured{secretOf(t, filepath.Join(e.hsm, "certs", "kubernetes-secret.yaml")), pinSecret}
}

// checkPodLog reads the trustd containers' logs in ns from the kubelet's
// pod log directory: the pkcs11 backend opened the key through the module
// in the image volume, and the PIN appears nowhere.
func (e *nodeEnv) checkPodLog(t *testing.T, ns string) {
	t.Helper()
	pin, err := os.ReadFile(filepath.Join(e.hsm, "pin"))
	check(t, err)
	logs, err := filepath.Glob(filepath.Join(e.state, "pod-logs", ns+"_*", "trustd", "*.log"))
	check(t, err)
	if len(logs) == 0 {
		t.Fatalf("no trustd container log under %s", filepath.Join(e.state, "pod-logs", ns+"_*"))
	}
	for _, f := range logs {
		b, err := os.ReadFile(f)
		check(t, err)
		if !strings.Contains(string(b), `"backend":"pkcs11"`) || strings.Contains(string(b), strings.TrimSpace(string(pin))) {
			t.Errorf("%s: want the pkcs11 key opened and the PIN never logged:\n%s", f, b)
		}
	}
}
