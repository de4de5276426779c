// Package apidtest is a test TLS server that authenticates clients the way
// a Talos worker's apid does, so ceremony tests can prove that an issued
// talosconfig really gets in: ClientCAs = the `ca` bundle trustd returned,
// RequireAndVerifyClientCert, ExtKeyUsage exactly [ClientAuth] (apid
// compares the list for equality) and the role set parsed from
// Subject.Organization with Talos's role.Parse (unknown or no role: out).
package apidtest

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/role"
)

// Server is a running apid-like TLS server on 127.0.0.1. After a
// successful handshake it writes the client's roles and closes.
type Server struct {
	ln   net.Listener
	wg   sync.WaitGroup
	done chan struct{}
}

// VerifyClient is apid's check on the client leaf after chain
// verification: EKU exactly [ClientAuth] and at least one known role.
func VerifyClient(leaf *x509.Certificate) (role.Set, error) {
	if len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth || len(leaf.UnknownExtKeyUsage) != 0 {
		return role.Set{}, fmt.Errorf("client certificate ExtKeyUsage %v is not exactly [ClientAuth]", leaf.ExtKeyUsage)
	}
	set, unknown := role.Parse(leaf.Subject.Organization)
	if len(unknown) > 0 {
		return role.Set{}, fmt.Errorf("unknown roles %v", unknown)
	}
	if len(set.Strings()) == 0 {
		return role.Set{}, errors.New("no role in the client certificate")
	}
	return set, nil
}

// Start serves TLS with serverCert (which clients verify against their
// talosconfig `ca`) and accepts client certificates chaining to clientCAs.
func Start(serverCert tls.Certificate, clientCAs []*x509.Certificate) (*Server, error) {
	pool := x509.NewCertPool()
	for _, c := range clientCAs {
		pool.AddCert(c)
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{serverCert},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no client certificate")
			}
			_, err := VerifyClient(cs.PeerCertificates[0])
			return err
		},
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{ln: ln, done: make(chan struct{})}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

func (s *Server) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			tc := c.(*tls.Conn)
			_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
			if err := tc.Handshake(); err != nil {
				return
			}
			set, err := VerifyClient(tc.ConnectionState().PeerCertificates[0])
			if err != nil {
				return
			}
			_, _ = io.WriteString(tc, strings.Join(set.Strings(), ",")+"\n")
		}()
	}
}

// Addr is the listening address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server and waits for its connections.
func (s *Server) Close() error {
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

// Login connects to addr with the current context of a talosconfig (its
// ca, crt and key), verifying the server as talosctl does with ServerName
// serverName, and returns the roles the server granted.
func Login(talosconfig []byte, addr, serverName string) (string, error) {
	cfg, err := clientconfig.FromBytes(talosconfig)
	if err != nil {
		return "", fmt.Errorf("parse talosconfig: %w", err)
	}
	ctx, ok := cfg.Contexts[cfg.Context]
	if !ok {
		return "", fmt.Errorf("talosconfig: context %q not found", cfg.Context)
	}
	dec := func(s string) []byte { b, _ := base64.StdEncoding.DecodeString(s); return b }
	cert, err := tls.X509KeyPair(dec(ctx.Crt), dec(ctx.Key))
	if err != nil {
		return "", fmt.Errorf("talosconfig crt/key: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(dec(ctx.CA)) {
		return "", errors.New("talosconfig ca holds no certificate")
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, &tls.Config{
		RootCAs:      roots,
		Certificates: []tls.Certificate{cert},
		ServerName:   serverName,
		MinVersion:   tls.VersionTLS12,
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(conn)
	if err != nil {
		return "", fmt.Errorf("after handshake: %w", err)
	}
	got := strings.TrimSpace(string(b))
	if got == "" {
		return "", errors.New("the server closed the connection: client certificate refused")
	}
	return got, nil
}
