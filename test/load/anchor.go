package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	stdx509 "crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/siderolabs/crypto/x509"
	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// anchor is a bare Talos-style SecurityService, the yardstick for the
// daemon's file-key path: what Talos's own trustd does per request
// (internal/app/trustd/internal/reg in Talos 1.14: token check, PEM
// decode and CSR parse for a log line, then siderolabs/crypto's
// NewCertificateFromCSRBytes, which parses the CA and key, parses and
// verifies the CSR and signs), on a default gRPC server over TLS. It has
// none of the daemon's limits, policy, metrics or audit.
type anchor struct {
	securityapi.UnimplementedSecurityServiceServer
	token        []byte
	caCrt, caKey []byte
	caBundle     []byte
	log          *log.Logger
}

// serveAnchor serves the anchor on ln with the gencreds directory dir
// (os-ca.crt, os-ca.key, server.crt, server.key, token) until ctx ends.
func serveAnchor(ctx context.Context, ln net.Listener, dir string, logOut io.Writer) error {
	read := func(name string) ([]byte, error) { return os.ReadFile(filepath.Join(dir, name)) }
	a := &anchor{log: log.New(logOut, "", log.LstdFlags)}
	var err error
	if a.caCrt, err = read("os-ca.crt"); err != nil {
		return err
	}
	if a.caKey, err = read("os-ca.key"); err != nil {
		return fmt.Errorf("the anchor signs with a file key: %w", err)
	}
	tok, err := read("token")
	if err != nil {
		return err
	}
	a.token, a.caBundle = bytes.TrimSpace(tok), a.caCrt
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key"))
	if err != nil {
		return err
	}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})))
	securityapi.RegisterSecurityServiceServer(g, a)
	go func() { <-ctx.Done(); g.Stop() }()
	fmt.Fprintf(logOut, "anchor listening on %s\n", ln.Addr())
	return g.Serve(ln)
}

// Certificate follows Talos's Registrator.Certificate.
func (a *anchor) Certificate(ctx context.Context, in *securityapi.CertificateRequest) (*securityapi.CertificateResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	got := sha256.Sum256([]byte(strings.Join(md.Get("token"), "")))
	want := sha256.Sum256(a.token)
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		return nil, status.Error(codes.Unauthenticated, "invalid token")
	}
	block, _ := pem.Decode(in.Csr)
	if block == nil {
		return nil, status.Error(codes.InvalidArgument, "failed to decode CSR")
	}
	req, err := stdx509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "failed to parse CSR: %s", err)
	}
	a.log.Printf("received CSR signing request: subject %s dns names %s addresses %s", req.Subject, req.DNSNames, req.IPAddresses)
	signed, err := x509.NewCertificateFromCSRBytes(a.caCrt, a.caKey, in.Csr,
		x509.KeyUsage(stdx509.KeyUsageDigitalSignature),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth}),
		x509.OverrideSubject(func(s *pkix.Name) { s.Organization = nil }))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "failed to sign CSR: %s", err)
	}
	return &securityapi.CertificateResponse{Ca: a.caBundle, Crt: signed.X509CertificatePEM}, nil
}

func runAnchor(o options, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	ln, err := net.Listen("tcp", o.addr)
	if err == nil {
		err = serveAnchor(ctx, ln, o.certs, stderr)
	}
	if err != nil {
		fmt.Fprintln(stderr, "load: anchor:", err)
		return 1
	}
	return 0
}
