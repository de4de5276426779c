// Package signertest is the conformance suite every signer backend runs:
// signatures verify for each supported hash, bad options are refused before
// the device is touched, Sign is safe for concurrent use, the key can sign
// an X.509 certificate and serve a TLS handshake.
package signertest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/signer"
)

// Options tunes the suite for a backend.
type Options struct {
	// Concurrency is how many goroutines sign at once (default 8).
	Concurrency int
	// SignaturesPerGoroutine (default 4).
	SignaturesPerGoroutine int
	// SkipRSAPSS skips RSA-PSS for tokens without it.
	SkipRSAPSS bool
}

// Run runs the conformance suite against s, which the caller opened and
// closes.
func Run(t *testing.T, s signer.Signer, o Options) {
	t.Helper()
	if o.Concurrency == 0 {
		o.Concurrency = 8
	}
	if o.SignaturesPerGoroutine == 0 {
		o.SignaturesPerGoroutine = 4
	}
	pub := s.Public()
	if pub == nil {
		t.Fatal("Public() returned nil")
	}
	t.Run("Describe", func(t *testing.T) { testDescribe(t, s) })
	t.Run("SignVerify", func(t *testing.T) { testSignVerify(t, s, o) })
	t.Run("BadOptions", func(t *testing.T) { testBadOptions(t, s) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, s, o) })
	t.Run("X509", func(t *testing.T) { testX509(t, s) })
	t.Run("TLS", func(t *testing.T) { testTLS(t, s) })
}

func testDescribe(t *testing.T, s signer.Signer) {
	d := s.Describe()
	if d.Backend == "" {
		t.Error("Describe().Backend is empty")
	}
	want, err := signer.Fingerprint(s.Public())
	if err != nil {
		t.Fatal(err)
	}
	if d.Fingerprint != want {
		t.Errorf("Describe().Fingerprint = %q, want %q", d.Fingerprint, want)
	}
	if got := signer.AlgorithmName(s.Public()); d.Algorithm != got {
		t.Errorf("Describe().Algorithm = %q, want %q", d.Algorithm, got)
	}
}

type signCase struct {
	name string
	opts crypto.SignerOpts
}

func signCases(pub crypto.PublicKey, o Options) []signCase {
	switch pub.(type) {
	case ed25519.PublicKey:
		return []signCase{{"Ed25519", crypto.Hash(0)}}
	case *rsa.PublicKey:
		cs := []signCase{{"PKCS1v15-SHA256", crypto.SHA256}, {"PKCS1v15-SHA384", crypto.SHA384}, {"PKCS1v15-SHA512", crypto.SHA512}}
		if !o.SkipRSAPSS {
			cs = append(cs, signCase{"PSS-SHA256", &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: crypto.SHA256}})
		}
		return cs
	case *ecdsa.PublicKey:
		return []signCase{{"SHA256", crypto.SHA256}, {"SHA384", crypto.SHA384}, {"SHA512", crypto.SHA512}}
	}
	return nil
}

// message returns the bytes to pass to Sign for opts: the message itself
// for Ed25519, its digest otherwise.
func message(msg []byte, opts crypto.SignerOpts) []byte {
	h := opts.HashFunc()
	if h == 0 {
		return msg
	}
	hh := h.New()
	hh.Write(msg)
	return hh.Sum(nil)
}

// Verify checks sig over msg (the message, not its digest) by pub.
func Verify(pub crypto.PublicKey, msg, sig []byte, opts crypto.SignerOpts) error {
	d := message(msg, opts)
	switch k := pub.(type) {
	case ed25519.PublicKey:
		if !ed25519.Verify(k, msg, sig) {
			return errors.New("ed25519 signature does not verify")
		}
		return nil
	case *ecdsa.PublicKey:
		if !ecdsa.VerifyASN1(k, d, sig) {
			return errors.New("ecdsa signature does not verify")
		}
		return nil
	case *rsa.PublicKey:
		if pss, ok := opts.(*rsa.PSSOptions); ok {
			return rsa.VerifyPSS(k, pss.Hash, d, sig, pss)
		}
		return rsa.VerifyPKCS1v15(k, opts.HashFunc(), d, sig)
	}
	return errors.New("unsupported public key type")
}

func testSignVerify(t *testing.T, s signer.Signer, o Options) {
	cases := signCases(s.Public(), o)
	if len(cases) == 0 {
		t.Fatalf("unsupported public key %T", s.Public())
	}
	msg := []byte("steward-trustd conformance message")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sig, err := s.Sign(rand.Reader, message(msg, c.opts), c.opts)
			if err != nil {
				t.Fatalf("Sign: %v", err)
			}
			if err := Verify(s.Public(), msg, sig, c.opts); err != nil {
				t.Fatal(err)
			}
			if err := Verify(s.Public(), []byte("another message"), sig, c.opts); err == nil {
				t.Fatal("signature verifies over a different message")
			}
		})
	}
}

func testBadOptions(t *testing.T, s signer.Signer) {
	var cases []struct {
		name   string
		digest []byte
		opts   crypto.SignerOpts
	}
	add := func(name string, digest []byte, opts crypto.SignerOpts) {
		cases = append(cases, struct {
			name   string
			digest []byte
			opts   crypto.SignerOpts
		}{name, digest, opts})
	}
	if _, ok := s.Public().(ed25519.PublicKey); ok {
		add("prehashed", make([]byte, 64), crypto.SHA512)
		add("sha256", make([]byte, 32), crypto.SHA256)
	} else {
		add("short digest", make([]byte, 31), crypto.SHA256)
		add("long digest", make([]byte, 33), crypto.SHA256)
		add("sha384 length mismatch", make([]byte, 32), crypto.SHA384)
		add("sha1", make([]byte, 20), crypto.SHA1)
		add("md5", make([]byte, 16), crypto.MD5)
		add("no hash", make([]byte, 32), crypto.Hash(0))
		add("nil opts", make([]byte, 32), nil)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sig, err := s.Sign(rand.Reader, c.digest, c.opts)
			if err == nil {
				t.Fatalf("Sign accepted %s (signature %x)", c.name, sig)
			}
			if !errors.Is(err, signer.ErrInvalidOptions) {
				t.Fatalf("Sign error %v does not wrap signer.ErrInvalidOptions", err)
			}
		})
	}
}

func testConcurrent(t *testing.T, s signer.Signer, o Options) {
	opts := signCases(s.Public(), o)[0].opts
	var wg sync.WaitGroup
	errs := make(chan error, o.Concurrency*o.SignaturesPerGoroutine)
	for g := 0; g < o.Concurrency; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < o.SignaturesPerGoroutine; i++ {
				msg := []byte{byte(g), byte(i), 'x'}
				sig, err := s.Sign(rand.Reader, message(msg, opts), opts)
				if err == nil {
					err = Verify(s.Public(), msg, sig, opts)
				}
				if err != nil {
					errs <- err
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// SelfSignedCA makes a CA certificate for s, signed by s.
func SelfSignedCA(t testing.TB, s crypto.Signer) *x509.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "conformance CA", Organization: []string{"talos"}},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, s.Public(), s)
	if err != nil {
		t.Fatalf("self-sign CA: %v", err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testX509(t *testing.T, s signer.Signer) {
	ca := SelfSignedCA(t, s)
	if err := ca.CheckSignatureFrom(ca); err != nil {
		t.Fatalf("self-signed CA does not verify: %v", err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "leaf"},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"leaf.example"},
	}
	der, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &leafKey.PublicKey, s)
	if err != nil {
		t.Fatalf("sign leaf: %v", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "leaf.example"}); err != nil {
		t.Fatalf("leaf does not verify against CA: %v", err)
	}
}

func testTLS(t *testing.T, s signer.Signer) {
	ca := SelfSignedCA(t, s)
	// The CA certificate doubles as the server certificate: the point is
	// that the handshake's CertificateVerify is produced by the signer.
	tmpl := *ca
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	tmpl.SerialNumber = big.NewInt(3)
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, &tmpl, s.Public(), s)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		t.Run(tls.VersionName(v), func(t *testing.T) {
			ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
				Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: s, Leaf: cert}},
				MinVersion:   v,
				MaxVersion:   v,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			done := make(chan error, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					done <- err
					return
				}
				defer c.Close()
				err = c.(*tls.Conn).HandshakeContext(context.Background())
				if err == nil {
					_, err = c.Write([]byte("ok"))
				}
				done <- err
			}()
			pool := x509.NewCertPool()
			pool.AddCert(cert)
			c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: v, MaxVersion: v})
			if err != nil {
				t.Fatalf("TLS handshake: %v", err)
			}
			buf := make([]byte, 2)
			_, rerr := io.ReadFull(c, buf)
			c.Close()
			if err := <-done; err != nil {
				t.Fatalf("server side: %v", err)
			}
			if rerr != nil || string(buf) != "ok" {
				t.Fatalf("read %q, %v", buf, rerr)
			}
		})
	}
}
