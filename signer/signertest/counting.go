package signertest

import (
	"crypto"
	"io"
	"sync/atomic"
)

// Counting wraps a crypto.Signer and counts the signatures asked of it:
// tests use it to prove that a request refused before signing never
// reached the device.
type Counting struct {
	crypto.Signer
	n atomic.Int64
}

// NewCounting wraps s.
func NewCounting(s crypto.Signer) *Counting { return &Counting{Signer: s} }

// Sign counts the call and passes it on.
func (c *Counting) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	c.n.Add(1)
	return c.Signer.Sign(r, digest, opts)
}

// Count is the number of Sign calls so far.
func (c *Counting) Count() int64 { return c.n.Load() }
