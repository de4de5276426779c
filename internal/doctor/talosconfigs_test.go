package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestParseWorkerConfigTalosVersions reads the worker configs Talos's own
// generator writes for each version contract 1.9–1.14 (testdata/talos,
// copied from Talos's stability goldens): 1.14 keeps the endpoint in a
// KubeClusterConfig document next to others with `endpoint` and
// `acceptedCAs` fields of their own (DiscoveryServiceConfig,
// KubeAPIServerCAConfig).
func TestParseWorkerConfigTalosVersions(t *testing.T) {
	files, err := filepath.Glob("testdata/talos/v1.*/*-worker.yaml")
	if err != nil || len(files) != 12 {
		t.Fatalf("fixtures: %v, %v", files, err)
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			wc, err := ParseWorkerConfig(data)
			if err != nil {
				t.Fatal(err)
			}
			if wc.Token != "d8cwfa.eyvpi0xwxyarbfid" || wc.CA.Subject.String() != "O=talos" || wc.HasCAKey || len(wc.AcceptedCAs) != 0 {
				t.Errorf("worker config = %+v", wc)
			}
			if host, err := wc.EndpointHost(); err != nil || host != "base" {
				t.Errorf("EndpointHost = %q, %v; want base", host, err)
			}
		})
	}
}

// TestParseWorkerConfigDocuments covers the multi-document rules: which
// document gives the endpoint, and the conflicts Talos refuses too.
func TestParseWorkerConfigDocuments(t *testing.T) {
	base, err := os.ReadFile("testdata/talos/v1.14/base-worker.yaml")
	if err != nil {
		t.Fatal(err)
	}
	kube := "apiVersion: v1alpha1\nkind: KubeClusterConfig\nclusterName: c\nendpoint: https://other:6443\n"
	legacy := strings.Replace(string(base), "cluster:\n", "cluster:\n    controlPlane:\n        endpoint: https://legacy:6443\n", 1)
	tests := []struct {
		name, doc, host, wantErr string
	}{
		{"1.14 as generated", string(base), "base", ""},
		{"both endpoints", legacy, "", "both cluster.controlPlane.endpoint and a KubeClusterConfig"},
		{"two KubeClusterConfigs", string(base) + "---\n" + kube, "", "a second KubeClusterConfig"},
		{"two v1alpha1", string(base) + "---\nversion: v1alpha1\nmachine: {}\n", "", "a second v1alpha1"},
		{"other kinds only", "apiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n---\n" + kube, "", "no document with a machine section"},
	}
	for _, tt := range tests {
		wc, ok := parseCase(t, tt.name, tt.doc, tt.wantErr)
		if !ok {
			continue
		}
		if host, err := wc.EndpointHost(); err != nil || host != tt.host {
			t.Errorf("%s: EndpointHost = %q, %v", tt.name, host, err)
		}
	}
}
