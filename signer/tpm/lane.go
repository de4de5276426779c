package tpm

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/signer"
)

// A lane is one connection to the TPM with the key loaded on it and a
// policy session kept between signatures. A Signer has one or two
// (connections=). With two, while one lane's TPM2_Sign runs, the next
// request's policy commands (PolicyPCR, PolicyAuthorize with the cached
// ticket, PolicyCommandCode) are already sent on the other and wait at the
// device — the kernel resource manager, or steward-tpm-relay standing in
// for it — so the chip does not wait for the host between signatures.
//
// A lane is used by one operation at a time: it is taken from
// Signer.free and given back. Its fields are the taker's, except sess,
// which an operation abandoned by runBounded's timeout may still touch.
type lane struct {
	index       int
	conn        transport.TPMCloser // nil while disconnected
	key         tpm2.TPMHandle      // loaded (transient) or persistent handle
	lastAttempt time.Time
	lastErr     error
	up          bool // for one log line per change of the connection's state
	sess        keptSession
}

// keptSession is a lane's kept policy session. It has its own lock, held
// only for these fields and never across TPM I/O, because an operation
// abandoned by runBounded's timeout keeps running in its goroutine after
// the lane was given back (a device read that Close does not interrupt):
// it must neither read a torn value nor clear or replace the session of
// the connection that replaced its own. gen counts the lane's
// connections; a session belongs to the connection it was started on,
// and whoever stops keeping a session flushes it.
type keptSession struct {
	mu   sync.Mutex
	gen  uint64
	sess tpm2.Session // started on connection gen; nil when none
}

// generation is the lane's current connection.
func (k *keptSession) generation() uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.gen
}

// get returns the session kept for connection gen, nil if none.
func (k *keptSession) get(gen uint64) tpm2.Session {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.gen != gen {
		return nil
	}
	return k.sess
}

// keep makes sess the session of connection gen. False when that
// connection was dropped meanwhile or a session is kept already: the
// caller then flushes sess.
func (k *keptSession) keep(gen uint64, sess tpm2.Session) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.gen != gen || k.sess != nil {
		return false
	}
	k.sess = sess
	return true
}

// settle ends an operation's use of sess on connection gen and reports
// whether the caller must flush it: after a failure (compare-and-clear:
// only if sess is still the kept one), or when the connection was dropped
// while the operation ran, so that nobody else will.
func (k *keptSession) settle(gen uint64, sess tpm2.Session, failed bool) (flush bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.gen != gen || k.sess != sess {
		return true
	}
	if failed {
		k.sess = nil
		return true
	}
	return false
}

// reset forgets the session of a connection that is being dropped or
// closed and starts the next generation; it returns the session, for a
// caller whose connection still works to flush.
func (k *keptSession) reset() tpm2.Session {
	k.mu.Lock()
	defer k.mu.Unlock()
	old := k.sess
	k.gen++
	k.sess = nil
	return old
}

// newLanes makes n lanes, all given back.
func newLanes(n int) ([]*lane, chan *lane) {
	lanes := make([]*lane, n)
	free := make(chan *lane, n)
	for i := range lanes {
		// up: a connection not yet made is not "down"; its first
		// failure is logged, its first success is not news.
		lanes[i] = &lane{index: i, up: true}
		free <- lanes[i]
	}
	return lanes, free
}

// take waits for a free lane; the caller gives it back with give.
func (s *Signer) take(ctx context.Context) (*lane, error) {
	select {
	case ln := <-s.free:
		return ln, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("tpm: waiting for a TPM connection: %w: %w", signer.ErrDeviceUnavailable, ctx.Err())
	}
}

func (s *Signer) give(ln *lane) { s.free <- ln }
