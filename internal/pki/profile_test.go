package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"strings"
	"testing"
	"time"
)

func TestParseRoles(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      []string
		want    string
		wantErr string
	}{
		{[]string{"os:admin"}, "os:admin", ""},
		{[]string{" os:reader ", "os:operator", "os:reader"}, "os:operator,os:reader", ""},
		{[]string{"os:etcd:backup"}, "os:etcd:backup", ""},
		{nil, "", "no role"},
		{[]string{"", " "}, "", "no role"},
		{[]string{"os:admin", "admin"}, "", "unknown role"},
		{[]string{"os:impersonator"}, "", "proxies only"},
	}
	for _, tt := range tests {
		got, err := ParseRoles(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseRoles(%q) err = %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || strings.Join(got, ",") != tt.want {
			t.Errorf("ParseRoles(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

func TestSerialNumber(t *testing.T) {
	t.Parallel()
	for _, src := range [][]byte{bytes.Repeat([]byte{0xff}, 16), make([]byte, 16)} {
		n, err := SerialNumber(bytes.NewReader(src))
		if err != nil {
			t.Fatal(err)
		}
		if n.Sign() <= 0 || n.BitLen() != 127 {
			t.Errorf("serial from %x: %x (%d bits)", src, n, n.BitLen())
		}
	}
	if _, err := SerialNumber(bytes.NewReader(nil)); err == nil {
		t.Error("short randomness accepted")
	}
}

func TestProfiles(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := checkCAProfile(t, key, now)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	checkServingProfile(t, ca, key, leafKey.Public(), now)
	checkClientProfile(t, ca, key, leafKey.Public(), now)
}

// checkCAProfile checks the OS CA profile (Talos's) and returns the CA.
func checkCAProfile(t *testing.T, key *ecdsa.PrivateKey, now time.Time) *x509.Certificate {
	t.Helper()
	ca, err := NewCACertificate(key, CAOptions{Cluster: "c"}, now, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if ca.NotAfter.Sub(now) != DefaultCAValidity || len(ca.ExtKeyUsage) != 2 || !ca.IsCA || !ca.BasicConstraintsValid {
		t.Errorf("CA: notAfter %v eku %v", ca.NotAfter, ca.ExtKeyUsage)
	}
	if _, err := NewCACertificate(key, CAOptions{Validity: -time.Hour}, now, rand.Reader); err == nil {
		t.Error("negative validity accepted")
	}
	return ca
}

// checkServingProfile checks trustd's serving certificate profile.
func checkServingProfile(t *testing.T, ca *x509.Certificate, key *ecdsa.PrivateKey, pub crypto.PublicKey, now time.Time) {
	t.Helper()
	srv, err := NewServingCertificate(ca, key, pub, []string{"10.0.0.1", "API.example.com"}, 0, now, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if len(srv.ExtKeyUsage) != 1 || srv.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth || srv.IsCA || srv.DNSNames[0] != "api.example.com" || len(srv.IPAddresses) != 1 {
		t.Errorf("serving profile %v %v %v", srv.ExtKeyUsage, srv.DNSNames, srv.IPAddresses)
	}
	for _, bad := range [][]string{nil, {"bad host"}, {"-x.example"}} {
		if _, err := NewServingCertificate(ca, key, pub, bad, 0, now, rand.Reader); err == nil {
			t.Errorf("hosts %q accepted", bad)
		}
	}
}

// checkClientProfile checks the talosctl client certificate profile.
func checkClientProfile(t *testing.T, ca *x509.Certificate, key *ecdsa.PrivateKey, pub crypto.PublicKey, now time.Time) {
	t.Helper()
	cl, err := NewClientCertificate(ca, key, pub, "", []string{"os:admin"}, 100*365*24*time.Hour, now, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if !cl.NotAfter.Equal(ca.NotAfter) {
		t.Errorf("client certificate outlives its CA: %v > %v", cl.NotAfter, ca.NotAfter)
	}
	if cl.Subject.CommonName != "talosctl" || len(cl.ExtKeyUsage) != 1 || cl.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Errorf("client profile %v %v", cl.Subject, cl.ExtKeyUsage)
	}
	if _, err := NewClientCertificate(ca, key, pub, "", nil, 0, now, rand.Reader); err == nil {
		t.Error("empty role set accepted")
	}
}
