package keystore

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/crashpoint"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// Keys opens and creates CA keys by key URI. *signer.Registry implements
// it; keystore never opens a device itself.
type Keys interface {
	Open(ctx context.Context, uri string) (signer.Signer, error)
	Generate(ctx context.Context, uri string, alg signer.Algorithm) (signer.Signer, error)
	Import(ctx context.Context, uri string, key crypto.Signer) (signer.Signer, error)
}

// PolicyChecker is implemented by signers whose key carries a use policy
// (the TPM backend: a PCR policy). CheckPolicy reports whether the device
// would let the key be used now, wrapping signer.ErrPolicyNotSatisfied if
// not.
type PolicyChecker interface {
	CheckPolicy(ctx context.Context) error
}

// Ceremony runs the OS CA key lifecycle operations. Every operation
// appends a Receipt under certdir.DirReceipts.
type Ceremony struct {
	// Keys opens and creates keys by URI.
	Keys Keys
	// Clock is the time source; nil means time.Now.
	Clock func() time.Time
	// Rand supplies serial numbers, tokens and locally generated keys.
	Rand io.Reader
	// Version is recorded in receipts.
	Version string
}

// Outcome is what an operation did, for the user.
type Outcome struct {
	// Receipt is the receipt written (zero if nothing was written).
	Receipt Receipt
	// Written lists the paths written or removed.
	Written []string
	// Resumed lists steps an earlier, interrupted run had already done.
	Resumed []string
	// AlreadyDone is true when the operation was complete already and
	// nothing was written.
	AlreadyDone bool
	// Notes are instructions for the operator.
	Notes []string
}

func (c *Ceremony) now() time.Time {
	if c.Clock == nil {
		return time.Now()
	}
	return c.Clock()
}

func (c *Ceremony) check() error {
	if c.Keys == nil || c.Rand == nil {
		return errors.New("ceremony: Keys and Rand are required")
	}
	return nil
}

// step marks a point at which a crash must be recoverable; a test build
// of the binary can be killed there (internal/crashpoint).
func (c *Ceremony) step(name string) { crashpoint.At(name) }

// Locker is implemented by a Dir that several processes may use at once
// (OSDir): Lock takes the directory for one operation and removes the
// temporary files of writes killed earlier (no other process can be
// writing them then); unlock releases it.
type Locker interface {
	Lock() (unlock func(), removed []string, err error)
}

// begin locks d (if it is a Locker) and reads its state, once, for one
// operation. The caller calls the returned unlock when done.
func (c *Ceremony) begin(d Dir) (*state, func(), error) {
	if err := c.check(); err != nil {
		return nil, nil, err
	}
	unlock := func() {}
	var removed []string
	if l, ok := d.(Locker); ok {
		var err error
		if unlock, removed, err = l.Lock(); err != nil {
			return nil, nil, err
		}
	}
	st, err := readState(d)
	if err != nil {
		unlock()
		return nil, nil, err
	}
	for _, r := range removed {
		st.cleaned = append(st.cleaned, "removed "+r+", the temporary file of a write that was killed")
	}
	return st, unlock, nil
}

// readOptional reads name from d; a missing file is (nil, nil).
func readOptional(d Dir, name string) ([]byte, error) {
	b, err := d.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", d.Path(name), err)
	}
	return b, nil
}

func without(certs []*x509.Certificate, drop ...*x509.Certificate) []*x509.Certificate {
	var out []*x509.Certificate
	for _, c := range certs {
		keep := true
		for _, d := range drop {
			if d != nil && bytes.Equal(c.Raw, d.Raw) {
				keep = false
			}
		}
		if keep {
			out = append(out, c)
		}
	}
	return out
}

// clusterFiles builds the cluster-level outputs derived from the CA state
// (token is the token file's content, one token per line):
// the root's trust statement (or its removal when nil), os-ca.crt, token,
// accepted-cas.crt (or its removal), the Kubernetes Secret (the daemon's
// cert dir without any CA key; server.crt/server.key included when given)
// and the worker patch. The statement goes first: a run killed before
// os-ca.crt is rewritten leaves a statement by a root the directory
// still names (os-ca.next.crt during a rotation's finish).
func clusterFiles(cluster string, ca *x509.Certificate, accepted []*x509.Certificate, token string, server map[string][]byte, statement []byte) ([]File, error) {
	if cluster == "" {
		cluster = "talos"
	}
	caPEM := pki.EncodeCertificates(ca)
	tokenFile := certdir.TokenFile(token)
	content := map[string][]byte{certdir.FileCACert: caPEM, certdir.FileToken: tokenFile}
	files := []File{{Name: certdir.FileTrustStatement, Remove: true}}
	if statement != nil {
		content[certdir.FileTrustStatement] = statement
		files[0] = File{Name: certdir.FileTrustStatement, Data: statement, Mode: 0o644}
	}
	files = append(files,
		File{Name: certdir.FileCACert, Data: caPEM, Mode: 0o644},
		File{Name: certdir.FileToken, Data: tokenFile, Mode: 0o600},
	)
	if len(accepted) > 0 {
		acc := pki.EncodeCertificates(accepted...)
		content[certdir.FileAcceptedCAs] = acc
		files = append(files, File{Name: certdir.FileAcceptedCAs, Data: acc, Mode: 0o644})
	} else {
		files = append(files, File{Name: certdir.FileAcceptedCAs, Remove: true})
	}
	for n, b := range server {
		content[n] = b
	}
	secret, err := certdir.KubernetesSecret(cluster, content)
	if err != nil {
		return nil, err
	}
	// One token, never several: a machine.token of two lines is valid
	// config that Talos's client never sends.
	patch, err := WorkerPatch(certdir.NewestToken(token), ca, accepted)
	if err != nil {
		return nil, err
	}
	return append(files,
		File{Name: certdir.FileWorkerPatch, Data: patch, Mode: 0o600},
		File{Name: certdir.FileKubernetesSecret, Data: secret, Mode: 0o600},
	), nil
}

// paths lists the written files (removals are listed in the receipt).
func paths(d Dir, files []File) []string {
	var out []string
	for _, f := range files {
		if !f.Remove {
			out = append(out, d.Path(f.Name))
		}
	}
	return out
}

func certReceipt(r *Receipt, c *x509.Certificate) {
	r.CertificateFingerprint = pki.CertFingerprint(c)
	r.CertificateSubject = c.Subject.String()
	r.CertificateSerial = c.SerialNumber.Text(16)
	r.CertificateNotAfter = c.NotAfter.UTC()
}

// VerifyDeviceSignature has s sign a fresh challenge and checks the
// signature against pub (the certificate's key), proving that the device
// holds the private half of pub and will use it.
func VerifyDeviceSignature(s crypto.Signer, pub crypto.PublicKey, r io.Reader) error {
	msg := make([]byte, 32)
	if _, err := io.ReadFull(r, msg); err != nil {
		return fmt.Errorf("challenge: %w", err)
	}
	msg = append([]byte("steward-trustd key ceremony check "), msg...)
	sig, err := pki.SignMessage(s, r, msg)
	if err != nil {
		return fmt.Errorf("sign a test message on the device: %w", err)
	}
	if err := pki.VerifySignature(pub, msg, sig); err != nil {
		return fmt.Errorf("the device's test signature does not verify with the certificate's key: %w", err)
	}
	return nil
}
