package doctor

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/pki"
)

func TestParseWorkerConfig(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca, err := pki.NewCACertificate(key, pki.CAOptions{Cluster: "c"}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	crt := base64.StdEncoding.EncodeToString(pki.EncodeCertificates(ca))
	machine := "machine:\n  token: abc.def\n  ca:\n    crt: " + crt + "\n"
	tests := []struct {
		name     string
		doc      string
		endpoint string
		caKey    bool
		accepted int
		wantErr  string
	}{
		{"patch", machine, "", false, 0, ""},
		{"full config", "version: v1alpha1\n" + machine + "cluster:\n  controlPlane:\n    endpoint: https://[fd00::1]:6443\n", "fd00::1", false, 0, ""},
		{"after another document", "apiVersion: v1alpha1\nkind: HostnameConfig\n---\n" + machine, "", false, 0, ""},
		{"rotation", machine + "  acceptedCAs:\n    - crt: " + crt + "\n", "", false, 1, ""},
		{"CA key present", strings.Replace(machine, "crt: "+crt, "crt: "+crt+"\n    key: a2V5", 1), "", true, 0, ""},
		{"no token", strings.Replace(machine, "abc.def", "\"\"", 1), "", false, 0, "machine.token is empty"},
		{"no CA", "machine:\n  token: t\n", "", false, 0, "machine.ca.crt is empty"},
		{"bad CA", strings.Replace(machine, crt, "bm90IGEgY2VydA==", 1), "", false, 0, "machine.ca.crt"},
		{"no machine section", "version: v1alpha1\n", "", false, 0, "no document with a machine section"},
		{"not YAML", "machine: [", "", false, 0, "machine config"},
	}
	for _, tt := range tests {
		wc, ok := parseCase(t, tt.name, tt.doc, tt.wantErr)
		if !ok {
			continue
		}
		if wc.Token != "abc.def" || !wc.CA.Equal(ca) || wc.HasCAKey != tt.caKey || len(wc.AcceptedCAs) != tt.accepted {
			t.Errorf("%s: %+v", tt.name, wc)
		}
		host, err := wc.EndpointHost()
		if host != tt.endpoint || (tt.endpoint == "") != (err != nil) {
			t.Errorf("%s: EndpointHost = %q, %v", tt.name, host, err)
		}
	}
}

// parseCase parses doc; with wantErr set it checks the error names it and
// returns false, otherwise it fails t on an error.
func parseCase(t *testing.T, name, doc, wantErr string) (*WorkerConfig, bool) {
	t.Helper()
	wc, err := ParseWorkerConfig([]byte(doc))
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s: err = %v, want %q", name, err, wantErr)
		}
		return nil, false
	}
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return wc, true
}
