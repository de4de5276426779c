package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
)

// TestTalosWorkerThroughService is the last step of `make e2e`
// (hack/e2e-node.sh), which runs it inside the test cluster's network
// namespace after test/k8s's TestNodeE2E left overlays/file's pod Ready:
// Talos v1.14.1's worker code (RemoteGenerator, both key generations)
// dials the Service's ClusterIP through kube-proxy with the cluster's
// machine token, verifies the served chain to os-ca.crt for that address,
// and must be issued an apid certificate that verifies for every name it
// asked for. It lives here, not in test/k8s, because Talos's module graph
// (a newer gRPC) would otherwise change the Kubernetes binaries test/k8s
// builds from that module.
func TestTalosWorkerThroughService(t *testing.T) {
	if os.Getenv("STEWARD_K8S_E2E") != "1" {
		t.Skip("node-level e2e: needs the cluster `make e2e` (root) starts; it sets STEWARD_K8S_E2E=1")
	}
	certs, addr := os.Getenv("E2E_CERTS"), os.Getenv("E2E_TRUSTD_ADDR")
	if certs == "" || addr == "" {
		t.Fatal("STEWARD_K8S_E2E=1 needs E2E_CERTS (gencreds' output) and E2E_TRUSTD_ADDR (the Service): run it through `make e2e`")
	}
	s := &served{addr: addr,
		token: strings.TrimSpace(string(readFile(t, filepath.Join(certs, certdir.FileToken)))),
		caPEM: readFile(t, filepath.Join(certs, certdir.FileCACert))}
	for _, ed25519 := range []bool{false, true} {
		crt, err := talosWorkerRequest(t, s, ed25519)
		if err != nil {
			t.Fatalf("Talos worker through the Service %s (ed25519 %v): %v (hack/e2e-node.sh prints the pod's log)", addr, ed25519, err)
		}
		checkWorkerCert(t, crt, s.caPEM)
		t.Logf("Talos worker (ed25519 %v) got a certificate through the Service %s", ed25519, addr)
	}
}
