package fleet

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/apidtest"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/internal/pki"
)

type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newCA(t *testing.T, cluster string) testCA {
	t.Helper()
	c, key := devtest.SelfSignedCA(t, cluster)
	return testCA{c, key}
}

// serving is an apid serving certificate issued by ca.
func serving(t *testing.T, ca testCA) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf, err := pki.NewServingCertificate(ca.cert, ca.key, key.Public(), []string{"127.0.0.1"}, time.Hour, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
}

// apid starts an apid-like server whose client-CA pool is bundle, as a
// worker sets it from its trustd's response.
func apid(t *testing.T, cert tls.Certificate, bundle ...testCA) string {
	t.Helper()
	var cas []*x509.Certificate
	for _, c := range bundle {
		cas = append(cas, c.cert)
	}
	s, err := apidtest.Start(cert, cas)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s.Addr()
}

// noClientAuth is a TLS server that asks for no client certificate.
func noClientAuth(t *testing.T, cert tls.Certificate) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

func closedPort(t *testing.T) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(devtest.FreePort(t)))
}

// TestCheck: a worker configured from a clean response (the root, or the
// root and a vouched rotation CA) is OK; one configured from a poisoned
// response — an extra CA, or one copying the root's name — is flagged and
// named, as are an apid asking for no client certificate and one whose
// serving certificate is not under the root; a closed port is
// unreachable.
func TestCheck(t *testing.T) {
	root, next, evil := newCA(t, "prod"), newCA(t, "prod-next"), newCA(t, "evil")
	twin := newCA(t, "prod") // the root's subject, another key
	good := serving(t, root)
	nodes := []struct {
		name, addr string
		want       Verdict
		reason     string
	}{
		{"clean", apid(t, good, root), OK, ""},
		{"clean rotation", apid(t, good, root, next), OK, ""},
		{"poisoned", apid(t, good, root, evil), Flagged, "CN=evil,O=talos"},
		{"poisoned with the root's name", apid(t, good, root, twin), Flagged, "CN=prod,O=talos"},
		{"serving certificate not under the root", apid(t, serving(t, evil), root), Flagged, "does not chain to the root"},
		{"no client certificate asked", noClientAuth(t, good), Flagged, "asks for no client certificate"},
		{"closed port", closedPort(t), Unreachable, "refused"},
	}
	c := &Checker{Root: root.cert, Vouched: []*x509.Certificate{root.cert, next.cert}, Timeout: 5 * time.Second, Concurrency: 3}
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr)
	}
	results := c.CheckAll(context.Background(), addrs)
	for i, n := range nodes {
		r := results[i]
		if r.Node != n.addr || r.Verdict != n.want || !strings.Contains(r.Reason, n.reason) {
			t.Errorf("%s: %s", n.name, r.Line())
		}
	}
	if !strings.Contains(results[2].Line(), "client CAs: CN=prod,O=talos; CN=evil,O=talos") {
		t.Errorf("advertised names not shown: %s", results[2].Line())
	}
	if err := Summarize(results); !errors.Is(err, ErrFlagged) || !strings.Contains(err.Error(), "4 of 7 nodes flagged, 1 unreachable") {
		t.Errorf("Summarize: %v", err)
	}
	if err := Summarize(results[:2]); err != nil {
		t.Errorf("Summarize of clean nodes: %v", err)
	}
}

func TestParseNodes(t *testing.T) {
	tests := []struct {
		name, spec string
		file       string
		limit      int
		want       []string
		wantErr    string
	}{
		{"cidr", "10.0.0.4/30", "", 8, []string{"10.0.0.4:50000", "10.0.0.5:50000", "10.0.0.6:50000", "10.0.0.7:50000"}, ""},
		{"cidr host bits masked", "10.0.0.5/31", "", 8, []string{"10.0.0.4:50000", "10.0.0.5:50000"}, ""},
		{"cidr over the cap", "10.0.0.0/16", "", 1024, nil, "2^16 addresses, more than the limit of 1024"},
		{"v6 cidr over the cap", "fd00::/64", "", 1024, nil, "more than the limit"},
		{"file", "nodes.txt", "# workers\n10.0.0.1\n\nw2.example:50001 # port given\nfd00::1\n[fd00::2]:7\n", 8,
			[]string{"10.0.0.1:50000", "w2.example:50001", "[fd00::1]:50000", "[fd00::2]:7"}, ""},
		{"file over the cap", "nodes.txt", "a\nb\nc\n", 2, nil, "more than 2 nodes"},
		{"bad port", "nodes.txt", "a:0\n", 8, nil, "line 1"},
		{"bad host", "nodes.txt", "a b\n", 8, nil, "not a host"},
		{"empty file", "nodes.txt", "# nothing\n", 8, nil, "names no node"},
		{"neither", "nodes.txt", "", 8, nil, "neither a CIDR nor a readable file"},
	}
	for _, tt := range tests {
		var file []byte
		if tt.file != "" {
			file = []byte(tt.file)
		}
		got, err := ParseNodes(tt.spec, file, DefaultPort, tt.limit)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: %v, want %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || strings.Join(got, " ") != strings.Join(tt.want, " ") {
			t.Errorf("%s: %v %v", tt.name, got, err)
		}
	}
}
