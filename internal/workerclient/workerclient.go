// Package workerclient asks trustd for a certificate the way a Talos
// worker does: a fresh key and CSR, a TLS connection that verifies trustd
// against machine.ca and machine.acceptedCAs for the exact host dialled,
// the token in gRPC metadata, and a response checked as the worker checks
// it. The doctor and the load tool both use it, so what they measure and
// diagnose is what workers do.
package workerclient

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// Port is the port Talos workers always dial.
const Port = "50001"

// TokenMetadata is the gRPC metadata key of the worker token.
const TokenMetadata = "token"

// Roots is the pool a worker verifies trustd with: machine.ca followed by
// machine.acceptedCAs.
func Roots(cas ...*x509.Certificate) *x509.CertPool {
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	return pool
}

// TLSConfig is a worker's client TLS configuration: roots as trust
// anchors, ServerName the host it dialled (an IP address or the
// endpoint's name), TLS 1.2 or newer, no client certificate.
func TLSConfig(roots *x509.CertPool, serverName string) *tls.Config {
	return &tls.Config{RootCAs: roots, ServerName: serverName, MinVersion: tls.VersionTLS12}
}

// Dial makes a gRPC client for addr (host:port, no name resolution) with
// tlsCfg; opts add e.g. a context dialer with a source address.
func Dial(addr string, tlsCfg *tls.Config, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg.Clone()))}, opts...)
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	return cc, nil
}

// KeyType is the worker key algorithm.
type KeyType string

// Key types of Talos workers.
const (
	// KeyP256 is an ECDSA P-256 key: Talos 1.10+ under an ECDSA or RSA CA.
	KeyP256 KeyType = "p256"
	// KeyEd25519 is Talos 1.9's key, and 1.10+'s under an Ed25519 CA.
	KeyEd25519 KeyType = "ed25519"
)

// ParseKeyType parses "p256" or "ed25519".
func ParseKeyType(s string) (KeyType, error) {
	switch k := KeyType(s); k {
	case KeyP256, KeyEd25519:
		return k, nil
	}
	return "", fmt.Errorf("key type %q: want p256 or ed25519", s)
}

// KeyTypeFor is the key a Talos 1.10+ worker makes under a CA with key
// caPub: Ed25519 under an Ed25519 CA, ECDSA P-256 otherwise.
func KeyTypeFor(caPub crypto.PublicKey) KeyType {
	if _, ok := caPub.(ed25519.PublicKey); ok {
		return KeyEd25519
	}
	return KeyP256
}

// NewCSR makes a fresh key of type kt and a PEM CSR for tmpl (subject and
// SANs) signed with it.
func NewCSR(r io.Reader, kt KeyType, tmpl *x509.CertificateRequest) (crypto.Signer, []byte, error) {
	key, err := newKey(r, kt)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificateRequest(r, tmpl, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create CSR: %w", err)
	}
	return key, pki.EncodeCSR(der), nil
}

func newKey(r io.Reader, kt KeyType) (crypto.Signer, error) {
	var key crypto.Signer
	var err error
	switch kt {
	case KeyEd25519:
		_, key, err = ed25519.GenerateKey(r)
	case KeyP256:
		key, err = ecdsa.GenerateKey(elliptic.P256(), r)
	default:
		return nil, fmt.Errorf("key type %q: want p256 or ed25519", kt)
	}
	if err != nil {
		return nil, fmt.Errorf("generate %s key: %w", kt, err)
	}
	return key, nil
}

// Response is a certificate trustd issued, checked as a worker checks it.
type Response struct {
	// Cert is the issued certificate and CertPEM its PEM.
	Cert    *x509.Certificate
	CertPEM []byte
	// Bundle is the returned `ca`, apid's client-CA pool.
	Bundle []*x509.Certificate
}

// Part names the piece of a response a ResponseError is about.
type Part string

// Parts of a response.
const (
	PartCert  Part = "crt"   // the certificate does not parse
	PartCA    Part = "ca"    // the CA bundle does not parse
	PartChain Part = "chain" // the certificate does not verify against the bundle
)

// ResponseError is a response a worker could not use.
type ResponseError struct {
	Part Part
	Err  error
}

// Error implements error.
func (e *ResponseError) Error() string { return fmt.Sprintf("response %s: %v", e.Part, e.Err) }

// Unwrap returns the cause.
func (e *ResponseError) Unwrap() error { return e.Err }

// Request asks for a certificate for csr with token in the metadata. A
// failed call returns the gRPC status error as it is; an unusable
// response returns a *ResponseError.
func Request(ctx context.Context, cc *grpc.ClientConn, token string, csr []byte) (*Response, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, TokenMetadata, token)
	resp, err := securityapi.NewSecurityServiceClient(cc).Certificate(ctx, &securityapi.CertificateRequest{Csr: csr})
	if err != nil {
		return nil, err //nolint:wrapcheck // callers need the gRPC status as it is
	}
	return Check(resp.GetCrt(), resp.GetCa())
}

// Check parses a response's crt and ca and verifies that crt chains to ca
// for ServerAuth. crt is the leaf, followed in the tiered setup by the
// issuer chain (apid serves it whole, and talosctl builds the path to the
// root through it), so the certificates after the first are used as
// intermediates.
func Check(crtPEM, caPEM []byte) (*Response, error) {
	chain, err := pki.ParseCertificates(crtPEM)
	if err != nil {
		return nil, &ResponseError{Part: PartCert, Err: err}
	}
	crt := chain[0]
	bundle, err := pki.ParseCertificates(caPEM)
	if err != nil {
		return nil, &ResponseError{Part: PartCA, Err: err}
	}
	opts := x509.VerifyOptions{Roots: Roots(bundle...), Intermediates: Roots(chain[1:]...), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if _, err := crt.Verify(opts); err != nil {
		return nil, &ResponseError{Part: PartChain, Err: err}
	}
	return &Response{Cert: crt, CertPEM: crtPEM, Bundle: bundle}, nil
}
