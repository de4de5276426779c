package keystore

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"io"
	"time"

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
