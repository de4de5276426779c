package server

import (
	"crypto/rand"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/signer"
)

// TestWorkerNames checks that the daemon applies pki's WorkerName rule:
// worker host names may carry '_' and a trailing dot, and are issued as
// asked; wildcards never are.
func TestWorkerNames(t *testing.T) {
	ca := newTestCA(t, signer.ECDSAP256)
	tests := []struct {
		name string
		ok   bool
	}{
		{"ip-10-0-0-7_eu-west-1", true},
		{"worker-1.cluster.example.", true},
		{"*.cluster.example", false},
		{"worker..example", false},
	}
	for _, tt := range tests {
		req, err := ParseRequest(makeCSR(t, csrSpec{key: newKey(t, "p256"), dns: []string{tt.name}}), Limits{})
		if !tt.ok {
			if err == nil || !strings.Contains(err.Error(), "not a valid DNS name") {
				t.Errorf("%q: err = %v", tt.name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tt.name, err)
		}
		issued, err := Issue(req, ca.cert, ca.signer, time.Hour, time.Now(), rand.Reader)
		if err != nil {
			t.Fatalf("%q: %v", tt.name, err)
		}
		cert, err := x509.ParseCertificate(issued.Raw)
		if err != nil || len(cert.DNSNames) != 1 || cert.DNSNames[0] != tt.name {
			t.Errorf("%q: issued %v, %v", tt.name, cert.DNSNames, err)
		}
	}
}
