package main

import (
	"bytes"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func TestServingHosts(t *testing.T) {
	ifaces := func() ([]net.Addr, error) {
		return []net.Addr{
			&net.IPNet{IP: net.ParseIP("10.0.0.5")},
			&net.IPNet{IP: net.ParseIP("127.0.0.1")},
			&net.IPNet{IP: net.ParseIP("fe80::1")},
			&net.IPAddr{IP: net.ParseIP("192.0.2.9")},
		}, nil
	}
	// What a process under RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
	// gets from socket(AF_NETLINK, ...).
	forbidden := func() ([]net.Addr, error) {
		return nil, &net.OpError{Op: "route", Net: "ip+net", Err: syscall.EAFNOSUPPORT}
	}
	named := func() (string, error) { return "mgmt-1", nil }
	unnamed := func() (string, error) { return "", errors.New("no hostname") }
	tests := []struct {
		name     string
		addrs    func() ([]net.Addr, error)
		hostname func() (string, error)
		extra    []string
		want     []string
		wantWarn bool
		wantErr  string
	}{
		{"interfaces", ifaces, named, []string{"trustd.example", "10.0.0.5"}, []string{"trustd.example", "10.0.0.5", "mgmt-1", "127.0.0.1"}, false, ""},
		{"netlink forbidden", forbidden, named, []string{"203.0.113.7"}, []string{"203.0.113.7", "mgmt-1"}, true, ""},
		{"netlink forbidden, hostname only", forbidden, named, nil, []string{"mgmt-1"}, true, ""},
		{"netlink forbidden, SANs only", forbidden, unnamed, []string{"203.0.113.7"}, []string{"203.0.113.7"}, true, ""},
		{"nothing at all", forbidden, unnamed, nil, nil, false, "set TRUSTD_CERT_SANS"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			src := hostSources{interfaceAddrs: tc.addrs, hostname: tc.hostname, log: slog.New(slog.NewJSONHandler(&logs, nil))}
			got, err := src.hosts(tc.extra)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, syscall.EAFNOSUPPORT) {
					t.Fatalf("err = %v, want one saying %q and wrapping EAFNOSUPPORT", err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("hosts = %v, %v; want %v", got, err, tc.want)
			}
			lines := strings.Count(logs.String(), "\n")
			if tc.wantWarn != (lines == 1) || (tc.wantWarn && !strings.Contains(logs.String(), `"level":"WARN"`)) ||
				(tc.wantWarn && !strings.Contains(logs.String(), "set TRUSTD_CERT_SANS")) {
				t.Fatalf("want warning %v, got %d lines: %s", tc.wantWarn, lines, logs.String())
			}
		})
	}
}

// TestWarnMissingSANs: a server.crt of the operator's own that lacks a
// TRUSTD_CERT_SANS entry is named once at start, with the way out.
func TestWarnMissingSANs(t *testing.T) {
	leaf := &x509.Certificate{DNSNames: []string{"trustd.example.com"}, IPAddresses: []net.IP{net.ParseIP("10.0.0.5"), net.ParseIP("fd00::5")}}
	tests := []struct {
		name    string
		sans    []string
		missing []string
	}{
		{"all named", []string{"10.0.0.5", "TRUSTD.example.com", "fd00:0::5"}, nil},
		{"none set", nil, nil},
		{"load balancer and endpoint missing", []string{"10.0.0.5", "203.0.113.10", "kube.example.com"}, []string{"203.0.113.10", "kube.example.com"}},
	}
	for _, tt := range tests {
		var logs bytes.Buffer
		warnMissingSANs(leaf, tt.sans, slog.New(slog.NewTextHandler(&logs, nil)))
		if got := missingSANs(leaf, tt.sans); !slices.Equal(got, tt.missing) {
			t.Errorf("%s: missing %v, want %v", tt.name, got, tt.missing)
		}
		warned := strings.Contains(logs.String(), "does not name these TRUSTD_CERT_SANS entries") && strings.Contains(logs.String(), "remove server.crt and server.key")
		if warned != (len(tt.missing) > 0) || strings.Count(logs.String(), "level=WARN") > 1 {
			t.Errorf("%s: log %q", tt.name, logs.String())
		}
	}
}
