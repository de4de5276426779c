package main

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/keyutil"
	"github.com/steward-trustd/steward-trustd/internal/workerclient"
)

// cpuBound is the local CPU bound: the work no server can skip per
// certificate, in-process on every core, with no network, TLS, gRPC,
// policy, lint, audit or metrics. Per certificate: decode, parse and
// verify the CSR, then x509.CreateCertificate, which signs with the file
// key and checks the new signature.
type cpuBound struct {
	ca   *x509.Certificate
	key  crypto.Signer
	csrs [][]byte
	next atomic.Int64
	errs atomic.Int64
}

// runCPUBound measures o.requests certificates on GOMAXPROCS goroutines
// with the cert dir's os-ca.crt and os-ca.key.
func runCPUBound(o options, stdout io.Writer) error {
	b, err := loadBound(o)
	if err != nil {
		return err
	}
	cores := runtime.GOMAXPROCS(0)
	start := time.Now()
	var wg sync.WaitGroup
	for range cores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.work()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if n := b.errs.Load(); n > 0 {
		return fmt.Errorf("%d of %d certificates failed", n, len(b.csrs))
	}
	fmt.Fprintf(stdout, "local CPU bound: %d certificates in %s (%.1f/s) on %d cores (parse + verify CSR, sign, x509's check of the signature; in-process)\n",
		len(b.csrs), elapsed.Round(time.Millisecond), float64(len(b.csrs))/elapsed.Seconds(), cores)
	return nil
}

func loadBound(o options) (*cpuBound, error) {
	dir := certdir.OSDir(o.certs)
	keyPEM, err := dir.ReadFile(certdir.FileCAKey)
	if err != nil {
		return nil, fmt.Errorf("-cpu-bound signs with the file key: %w", err)
	}
	key, err := keyutil.ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certdir.FileCAKey, err)
	}
	ca, _, err := certdir.ReadBundle(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.certs, err)
	}
	csrs, err := premadeCSRs(workerclient.KeyType(o.keyType), o.requests)
	if err != nil {
		return nil, err
	}
	return &cpuBound{ca: ca, key: key, csrs: csrs}, nil
}

func (b *cpuBound) work() {
	for {
		i := b.next.Add(1) - 1
		if i >= int64(len(b.csrs)) {
			return
		}
		if err := b.issue(b.csrs[i]); err != nil {
			b.errs.Add(1)
		}
	}
}

// errNoCSR is a pre-made CSR that is not PEM (never expected).
var errNoCSR = errors.New("CSR is not PEM")

func (b *cpuBound) issue(csrPEM []byte) error {
	block, _ := pem.Decode(csrPEM)
	if block == nil {
		return errNoCSR
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return err
	}
	if err := csr.CheckSignature(); err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      csr.Subject, DNSNames: csr.DNSNames, IPAddresses: csr.IPAddresses,
		NotBefore: now, NotAfter: now.Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	_, err = x509.CreateCertificate(rand.Reader, tmpl, b.ca, csr.PublicKey, b.key)
	return err
}
