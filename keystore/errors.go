package keystore

import (
	"errors"
	"fmt"
	"time"

	"github.com/steward-trustd/steward-trustd/signer"
)

// Sentinels of the ceremony, for errors.Is.
var (
	// ErrNoRotation reports `rotate --finish` in a directory without a
	// rotation in progress (no os-ca.next.crt).
	ErrNoRotation = errors.New("no rotation in progress")
	// ErrKeyMismatch reports a key at the signer URI that is not the key
	// of the CA certificate it is to sign for.
	ErrKeyMismatch = errors.New("the key does not match the CA certificate")
	// ErrForeignKey reports a key at the signer URI that this ceremony
	// directory has no record of creating; it is never adopted or
	// replaced. Errors wrapping it also wrap signer.ErrKeyExists.
	ErrForeignKey = errors.New("a key this ceremony did not create exists at the signer URI")
	// ErrInterrupted reports an interrupted key creation that must be
	// resumed (with the signer URI it was started with) before anything
	// else creates a key in the directory.
	ErrInterrupted = errors.New("an interrupted key creation must be resumed first")
	// ErrBusy reports that another ceremony holds the directory.
	ErrBusy = errors.New("another ceremony is running in this directory")
)

// ForeignKeyError is a key found at the signer URI that neither a receipt
// nor an interrupted run's intent record of the directory vouches for.
type ForeignKeyError struct {
	// Fingerprint and Location describe the key found.
	Fingerprint, Location string
	// Receipts is the receipts directory that was searched.
	Receipts string
}

func (e *ForeignKeyError) Error() string {
	return fmt.Sprintf("%v: a key (fingerprint %s, %s) already exists at the signer URI and %s holds neither a receipt nor an interrupted-run record for it, so this ceremony did not create it and will not adopt it; "+
		"choose another key location, bring an existing CA key in with `import`, or, if you know the key is unused, delete it from the device and re-run",
		ErrForeignKey, e.Fingerprint, e.Location, e.Receipts)
}

// Is makes the error match ErrForeignKey and signer.ErrKeyExists.
func (e *ForeignKeyError) Is(target error) bool {
	return target == ErrForeignKey || target == signer.ErrKeyExists
}

// InterruptedError is an outstanding intent record for a key at another
// address than the one asked for now: the interrupted run may have
// created a key there, so a new key elsewhere could be a second one.
type InterruptedError struct {
	// Operation is the key operation ("init.key", "rotate.key").
	Operation Operation
	// Address is the signer URI (without its query) of the interrupted run.
	Address string
	// Since is when the interrupted run recorded its intent.
	Since time.Time
	// Record is the path of the intent record.
	Record string
}

func (e *InterruptedError) Error() string {
	return fmt.Sprintf("%v: a run interrupted at %s was creating a key at %s; re-run with that signer URI to resume it, or, if no key exists there, remove %s",
		ErrInterrupted, e.Since.UTC().Format(time.RFC3339), e.Address, e.Record)
}

// Unwrap returns ErrInterrupted.
func (e *InterruptedError) Unwrap() error { return ErrInterrupted }

// KeyNotRecordedError is a partial failure: the key was created on the
// device but its receipt could not be written. The intent record written
// before the key was created still names it, so re-running the same
// command recognises the key and records it.
type KeyNotRecordedError struct {
	// Operation is the key operation ("init.key", "rotate.key").
	Operation Operation
	// Fingerprint and Location describe the new key.
	Fingerprint, Location string
	// Err is why the receipt was not written.
	Err error
}

func (e *KeyNotRecordedError) Error() string {
	return fmt.Sprintf("the key was created on the device (fingerprint %s, %s) but its %q receipt could not be written: %v; fix that and re-run the same command, which will recognise the key by the intent record",
		e.Fingerprint, e.Location, e.Operation, e.Err)
}

// Unwrap returns the cause.
func (e *KeyNotRecordedError) Unwrap() error { return e.Err }
