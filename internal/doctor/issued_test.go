package doctor

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// TestCheckIssued: the issued certificate is verified as talosctl verifies
// apid: to talosctl's CA, for ServerAuth, at the node address; each
// failure says why talosctl would refuse it.
func TestCheckIssued(t *testing.T) {
	now := time.Now()
	ca, caKey := testCA(t, now)
	other, _ := testCA(t, now)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	issue := func(ips ...string) []byte {
		w := pki.WorkerRequest{Subject: pkix.Name{CommonName: "w"}, PublicKey: key.Public()}
		for _, ip := range ips {
			w.IPs = append(w.IPs, net.ParseIP(ip))
		}
		is, err := pki.NewWorkerCertificate(ca, caKey, w, time.Hour, now, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(is.Raw)
		if err != nil {
			t.Fatal(err)
		}
		return pki.EncodeCertificates(c)
	}
	tests := []struct {
		name     string
		crt      []byte
		trust    *x509.Certificate
		node     string
		wantHint string
	}{
		{"as talosctl accepts it", issue("10.5.0.2"), ca, "10.5.0.2", ""},
		{"another CA", issue("10.5.0.2"), other, "10.5.0.2", "does not chain to"},
		{"node address missing", issue("10.5.0.3"), ca, "10.5.0.2", "does not name the node address 10.5.0.2"},
		{"not a certificate", []byte("garbage"), ca, "10.5.0.2", "no usable certificate"},
	}
	for _, tt := range tests {
		r := &Report{}
		ok := checkIssued(r, "x", tt.crt, tt.trust, tt.node)
		step := r.Steps[len(r.Steps)-1]
		if ok != (tt.wantHint == "") || step.Name != "talosctl verify" || !strings.Contains(step.Hint, tt.wantHint) {
			t.Errorf("%s: ok %v, step %+v, want hint %q", tt.name, ok, step, tt.wantHint)
		}
	}
}

func testCA(t *testing.T, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	c, err := pki.NewCACertificate(k, pki.CAOptions{Cluster: "c"}, now, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}
