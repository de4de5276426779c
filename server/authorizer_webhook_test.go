package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/authz"
)

const allowJSON = `{"apiVersion":"` + authz.APIVersion + `","allow":true,"outcome":"allowed","reason":"ok"}`

func decisionReq() *authz.Request {
	return &authz.Request{APIVersion: authz.APIVersion, Peer: "10.0.0.1", DNSNames: []string{"w1"}, IPAddresses: []string{"10.0.0.1"}}
}

// pkiFiles is a CA and a leaf it signed, written as PEM files.
type pkiFiles struct {
	ca       *x509.Certificate
	caKey    *ecdsa.PrivateKey
	caFile   string
	dir      string
	certPool *x509.CertPool
}

func newPKIFiles(t *testing.T, name string) *pkiFiles {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &pkiFiles{ca: ca, caKey: key, dir: t.TempDir(), certPool: x509.NewCertPool()}
	p.certPool.AddCert(ca)
	p.caFile = p.write(t, name+"-ca.crt", "CERTIFICATE", der)
	return p
}

func (p *pkiFiles) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// leaf issues a certificate for usage; it returns it and its files.
func (p *pkiFiles) leaf(t *testing.T, name string, usage x509.ExtKeyUsage) (tls.Certificate, string, string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, p.write(t, name+".crt", "CERTIFICATE", der), p.write(t, name+".key", "PRIVATE KEY", kder)
}

// mtlsServer serves h over TLS, demanding a client certificate of clients.
func mtlsServer(t *testing.T, h http.HandlerFunc, server *pkiFiles, clients *x509.CertPool) string {
	t.Helper()
	cert, _, _ := server.leaf(t, "authorizer", x509.ExtKeyUsageServerAuth)
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: clients, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestWebhookBadInputNeverAllows(t *testing.T) {
	serverPKI, clientPKI := newPKIFiles(t, "server"), newPKIFiles(t, "client")
	_, crt, key := clientPKI.leaf(t, "trustd", x509.ExtKeyUsageClientAuth)
	files := WebhookTLS{CAFile: serverPKI.caFile, CertFile: crt, KeyFile: key}
	cases := []struct {
		name string
		h    http.HandlerFunc
		err  string
	}{
		{"allow", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, allowJSON) }, ""},
		{"malformed JSON", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, `{"allow":tru`) }, "malformed"},
		{"oversized", func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, `{"apiVersion":"`+authz.APIVersion+`","allow":true,"outcome":"allowed","reason":"`+strings.Repeat("x", authz.MaxMessageBytes)+`"}`)
		}, "larger than"},
		{"slow", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}, "deadline"},
		{"status 500", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "boom", http.StatusInternalServerError) }, "500"},
		{"redirect", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/elsewhere", http.StatusFound) }, "redirect"},
		{"allow with denial outcome", func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, `{"apiVersion":"`+authz.APIVersion+`","allow":true,"outcome":"denied_pinned","reason":""}`)
		}, "contradicts"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			url := mtlsServer(t, c.h, serverPKI, clientPKI.certPool)
			d, err := NewWebhook(url, files)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			resp, err := d.Decide(ctx, decisionReq())
			if c.err == "" {
				if err != nil || !resp.Allow {
					t.Fatalf("got %+v, %v", resp, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("got %+v, %v; want an error containing %q", resp, err, c.err)
			}
		})
	}
}

func TestWebhookMTLS(t *testing.T) {
	serverPKI, clientPKI, strangerPKI := newPKIFiles(t, "server"), newPKIFiles(t, "client"), newPKIFiles(t, "stranger")
	url := mtlsServer(t, func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, allowJSON) }, serverPKI, clientPKI.certPool)
	_, goodCrt, goodKey := clientPKI.leaf(t, "trustd", x509.ExtKeyUsageClientAuth)
	_, badCrt, badKey := strangerPKI.leaf(t, "intruder", x509.ExtKeyUsageClientAuth)
	cases := []struct {
		name  string
		files WebhookTLS
		ok    bool
	}{
		{"right client", WebhookTLS{CAFile: serverPKI.caFile, CertFile: goodCrt, KeyFile: goodKey}, true},
		{"wrong client", WebhookTLS{CAFile: serverPKI.caFile, CertFile: badCrt, KeyFile: badKey}, false},
		{"no client certificate", WebhookTLS{CAFile: serverPKI.caFile}, false},
		{"server from another CA", WebhookTLS{CAFile: strangerPKI.caFile, CertFile: goodCrt, KeyFile: goodKey}, false},
	}
	for _, c := range cases {
		d, err := NewWebhook(url, c.files)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := d.Decide(context.Background(), decisionReq())
		if (err == nil) != c.ok || (err == nil && !resp.Allow) {
			t.Errorf("%s: got %+v, %v", c.name, resp, err)
		}
	}
	if _, err := NewWebhook(url, WebhookTLS{CertFile: goodCrt}); err == nil {
		t.Error("certificate without key accepted")
	}
}

func TestWebhookUnixSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "authz.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, allowJSON) }), ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	d, err := NewWebhook("unix://"+path, WebhookTLS{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mode os.FileMode
		ok   bool
	}{{0o660, true}, {0o666, false}, {0o600, true}} {
		if err := os.Chmod(path, c.mode); err != nil {
			t.Fatal(err)
		}
		d.(*webhook).client.CloseIdleConnections()
		_, err := d.Decide(context.Background(), decisionReq())
		if (err == nil) != c.ok {
			t.Errorf("mode %v: %v", c.mode, err)
		}
	}
	if os.Getuid() == 0 { // a socket of another user: only root can make one here
		if err := os.Chown(path, 12345, 12345); err != nil {
			t.Fatal(err)
		}
		if err := checkSocket(path, 0); err == nil || !strings.Contains(err.Error(), "owned by uid 12345") {
			t.Errorf("foreign socket: %v", err)
		}
		if err := checkSocket(path, 12345); err != nil {
			t.Errorf("socket of the configured uid: %v", err)
		}
	}
	if err := checkSocket(filepath.Join(dir), 0); err == nil {
		t.Error("a directory passed as a socket")
	}
	if err := checkSocket(filepath.Join(dir, "missing.sock"), 0); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing socket: %v", err)
	}
}
