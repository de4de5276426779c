package doctor

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/pki"
)

type fakeResolver map[string][]string

func (f fakeResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	if a, ok := f[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func TestRunStopsEarly(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca, err := pki.NewCACertificate(key, pki.CAOptions{Cluster: "c"}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	tests := []struct {
		name     string
		cfg      *WorkerConfig
		endpoint string
		lastStep string
		hint     string
	}{
		{"no config", nil, "", "machine config", ""},
		{"CA key in worker config", &WorkerConfig{Token: "t", CA: ca, HasCAKey: true}, "", "machine config", "must not hold the OS CA key"},
		{"no endpoint", &WorkerConfig{Token: "t", CA: ca}, "", "endpoint", "--endpoint"},
		{"bad endpoint flag", &WorkerConfig{Token: "t", CA: ca}, "nohostport", "endpoint", "host:port"},
		{"unresolvable", &WorkerConfig{Token: "t", CA: ca, Endpoint: "https://api.missing.example:6443"}, "", "dns", "cannot resolve"},
		{"refused", &WorkerConfig{Token: "t", CA: ca}, closed, "tcp", "connection refused"},
		{"resolved then refused", &WorkerConfig{Token: "t", CA: ca, Endpoint: "https://api.local.example:6443"}, "", "tcp", "connection refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := Options{Config: tt.cfg, Endpoint: tt.endpoint, Timeout: 2 * time.Second, Rand: rand.Reader,
				Resolver: fakeResolver{"api.local.example": {"127.0.0.1"}}}
			if tt.name == "resolved then refused" {
				// nothing listens on 127.0.0.1:50001 in the test environment
				if c, err := net.Dial("tcp", "127.0.0.1:50001"); err == nil {
					c.Close()
					t.Skip("something listens on 127.0.0.1:50001")
				}
			}
			r := Run(context.Background(), o)
			if r.OK() {
				t.Fatal("report OK")
			}
			last := r.Steps[len(r.Steps)-1]
			if last.Name != tt.lastStep || last.OK || !strings.Contains(last.Hint, tt.hint) {
				t.Errorf("last step %+v, want failed %q with hint %q", last, tt.lastStep, tt.hint)
			}
		})
	}
}

func TestTCPHint(t *testing.T) {
	if h := tcpHint(context.DeadlineExceeded, "a:50001"); !strings.Contains(h, "deadline exceeded") || !strings.Contains(h, "not exposed") {
		t.Errorf("deadline hint %q", h)
	}
	if h := tcpHint(errors.New("other"), "a:50001"); !strings.Contains(h, "cannot open") {
		t.Errorf("generic hint %q", h)
	}
}
