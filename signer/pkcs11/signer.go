//go:build cgo

package pkcs11

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	p11 "github.com/miekg/pkcs11"

	"github.com/steward-trustd/steward-trustd/signer"
)

// Recovery backoff after a device loss: first retry soon (a finalized
// module comes back at once), then at most every maxBackoff.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// conn is one logged-in connection to the token: the slot, an anchor
// session that keeps the login alive (PKCS#11 v2.40 §5.6: the login ends
// when the application's last session on the token closes) and the key
// handle, valid for module generation modGen only.
type conn struct {
	id     uint64 // increases with every (re)connect of a Signer
	modGen uint64
	slot   uint
	anchor p11.SessionHandle
	key    p11.ObjectHandle
}

// session is a pooled session handle and the connection it belongs to.
type session struct {
	h      p11.SessionHandle
	connID uint64
	modGen uint64
	key    p11.ObjectHandle
}

// Signer signs with a private key on a PKCS#11 token. Sign is safe for
// concurrent use: each call takes a session from a bounded pool.
type Signer struct {
	mod    *module
	mods   *modules
	logger *slog.Logger
	uri    *URI
	pin    string
	pub    crypto.PublicKey
	desc   signer.Description

	// sem bounds the sessions in use (and so the sessions open) to its
	// capacity.
	sem chan struct{}

	mu         sync.Mutex
	closed     bool
	healthy    bool
	cause      error // why the signer is not healthy
	fatal      error // a refused PIN: no more logins until re-opened
	conn       conn
	idle       []session
	recovering bool
	stop       chan struct{}
	done       chan struct{}
}

// Public implements crypto.Signer. The key was read at open.
func (s *Signer) Public() crypto.PublicKey { return s.pub }

// Describe implements signer.Signer.
func (s *Signer) Describe() signer.Description { return s.desc }

// Sign implements crypto.Signer. rand is ignored: the token uses its own
// random number generator. ECDSA signatures are returned in ASN.1 DER.
// While the token is lost Sign fails fast with signer.ErrDeviceUnavailable
// and the Signer reconnects in the background.
func (s *Signer) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if err := signer.CheckOpts(s.pub, digest, opts); err != nil {
		return nil, err
	}
	req, err := newSignRequest(s.pub, digest, opts)
	if err != nil {
		return nil, err
	}
	raw, err := s.signRaw(req)
	if err != nil {
		return nil, err
	}
	return req.finish(raw)
}

func (s *Signer) signRaw(req signRequest) ([]byte, error) {
	s.sem <- struct{}{}
	defer func() { <-s.sem }()
	sess, err := s.get()
	if err != nil {
		return nil, err
	}
	ctx := s.mod.ctx
	err = ctx.SignInit(sess.h, req.mech, sess.key)
	var sig []byte
	if err == nil {
		sig, err = ctx.Sign(sess.h, req.data)
		if err != nil {
			err = wrap("C_Sign", err)
		}
	} else {
		err = wrap("C_SignInit", err)
	}
	if err != nil {
		s.put(sess, err)
		return nil, err
	}
	s.put(sess, nil)
	return sig, nil
}

// get returns an idle session or opens one. The caller holds a sem slot.
func (s *Signer) get() (session, error) {
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return session{}, errors.New("pkcs11 sign: signer is closed")
	case s.fatal != nil:
		err := s.fatal
		s.mu.Unlock()
		return session{}, err
	case !s.healthy:
		cause := s.cause
		s.mu.Unlock()
		return session{}, fmt.Errorf("pkcs11 sign: token %q is reconnecting: %w", s.uri.Token, unavailable(cause))
	}
	if n := len(s.idle); n > 0 {
		sess := s.idle[n-1]
		s.idle = s.idle[:n-1]
		s.mu.Unlock()
		return sess, nil
	}
	c := s.conn
	s.mu.Unlock()
	// C_OpenSession outside the lock: other signers keep going meanwhile.
	h, err := s.mod.ctx.OpenSession(c.slot, p11.CKF_SERIAL_SESSION)
	if err != nil {
		err = wrap("C_OpenSession", err)
		if deviceLost(err) {
			s.fail(c.id, err)
		}
		return session{}, err
	}
	return session{h: h, connID: c.id, modGen: c.modGen, key: c.key}, nil
}

// unavailable makes sure err says ErrDeviceUnavailable.
func unavailable(err error) error {
	if err == nil {
		return signer.ErrDeviceUnavailable
	}
	if errors.Is(err, signer.ErrDeviceUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", signer.ErrDeviceUnavailable, err)
}

// put returns a session after use. A session that failed is closed, never
// pooled again; a device loss also starts reconnecting.
func (s *Signer) put(sess session, err error) {
	if err == nil {
		s.mu.Lock()
		if !s.closed && s.healthy && sess.connID == s.conn.id {
			s.idle = append(s.idle, sess)
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		s.closeSession(sess.h, sess.modGen)
		return
	}
	if deviceLost(err) {
		s.fail(sess.connID, err)
		// The handle may be stale or reused after re-initialisation;
		// closeSession only touches it within its module generation.
	}
	s.closeSession(sess.h, sess.modGen)
}

// closeSession closes h unless the module was re-initialised since h was
// opened: then h may name another Signer's new session.
func (s *Signer) closeSession(h p11.SessionHandle, modGen uint64) {
	if s.mod.generation() != modGen {
		return
	}
	_ = s.mod.ctx.CloseSession(h) // a dead session fails to close; nothing to do
}

// fail marks connection connID broken because of cause, drops its idle
// sessions and starts reconnecting. Failures of an older connection are
// ignored: the signer already reconnected.
func (s *Signer) fail(connID uint64, cause error) {
	s.mu.Lock()
	if s.closed || !s.healthy || connID != s.conn.id {
		s.mu.Unlock()
		return
	}
	s.healthy = false
	s.cause = cause
	idle := s.idle
	s.idle = nil
	old := s.conn
	s.startRecovery()
	s.mu.Unlock()
	s.mod.setHealthy(-1)
	s.logger.Warn("pkcs11 token lost; signing is unavailable until it reconnects",
		"token", s.uri.Token, "key", s.desc.Location, "error", cause)
	for _, sess := range idle {
		s.closeSession(sess.h, sess.modGen)
	}
	s.closeSession(old.anchor, old.modGen)
}

// startRecovery starts the reconnect goroutine. s.mu is held.
func (s *Signer) startRecovery() {
	if s.recovering {
		return
	}
	s.recovering = true
	s.stop = make(chan struct{})
	s.done = make(chan struct{})
	go s.recoverLoop(s.stop, s.done)
}

func (s *Signer) recoverLoop(stop, done chan struct{}) {
	defer close(done)
	backoff := minBackoff
	lastMsg := ""
	for {
		select {
		case <-stop:
			return
		case <-time.After(backoff):
		}
		err := s.reconnect()
		if err == nil {
			s.logger.Info("pkcs11 token reconnected", "token", s.uri.Token, "key", s.desc.Location)
			return
		}
		if errors.Is(err, signer.ErrAuthentication) {
			// Never try the PIN again: tokens lock after a few failures.
			s.mu.Lock()
			s.fatal = fmt.Errorf("pkcs11: token %q refused the PIN while reconnecting; fix the PIN and restart: %w", s.uri.Token, err)
			s.recovering = false
			s.mu.Unlock()
			s.logger.Error("pkcs11 token refused the PIN on reconnect; not retrying", "token", s.uri.Token, "error", err)
			return
		}
		s.mu.Lock()
		s.cause = err
		s.mu.Unlock()
		if msg := err.Error(); msg != lastMsg {
			lastMsg = msg
			s.logger.Warn("pkcs11 reconnect failed; retrying", "token", s.uri.Token, "error", err)
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// reconnect re-initialises the module if needed, logs in again and finds
// the key, which must still be the key opened.
func (s *Signer) reconnect() error {
	s.mu.Lock()
	old := s.conn
	s.mu.Unlock()
	// A finalized module only needs C_Initialize; that harms nobody.
	if err := s.mod.reinit(old.modGen, false); err != nil {
		return err
	}
	c, err := connect(s.mod, s.uri, s.pin)
	if errors.Is(err, signer.ErrDeviceUnavailable) {
		// The token may be back without the module having noticed:
		// SoftHSM and some HSM modules rescan only at C_Initialize. Only
		// done when no Signer on this module is healthy.
		if rerr := s.mod.reinit(s.mod.generation(), true); rerr != nil {
			return rerr
		}
		c, err = connect(s.mod, s.uri, s.pin)
	}
	if err != nil {
		return err
	}
	ka, err := readKeyAttrs(s.mod.ctx, c.anchor, c.key)
	if err == nil {
		var pub crypto.PublicKey
		pub, err = readPublicKey(s.mod.ctx, c.anchor, c.key, ka)
		if err == nil && !publicEqual(pub, s.pub) {
			err = fmt.Errorf("pkcs11: the key %s on token %q is not the key that was opened (public key changed); refusing to sign with it: %w", objectSelector(s.uri), s.uri.Token, signer.ErrDeviceUnavailable)
		}
		if err == nil && !s.uri.AllowExtractable && (ka.extractable || !ka.sensitive) {
			err = fmt.Errorf("pkcs11: the key on token %q became extractable: %w", s.uri.Token, signer.ErrDeviceUnavailable)
		}
	}
	if err != nil {
		s.closeSession(c.anchor, c.modGen)
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.recovering = false
		s.mu.Unlock()
		s.closeSession(c.anchor, c.modGen)
		return nil
	}
	c.id = old.id + 1
	s.conn = c
	s.healthy = true
	s.cause = nil
	s.recovering = false
	s.mu.Unlock()
	s.mod.setHealthy(1)
	return nil
}

type publicKeyEqual interface {
	Equal(crypto.PublicKey) bool
}

func publicEqual(a, b crypto.PublicKey) bool {
	e, ok := a.(publicKeyEqual)
	return ok && e.Equal(b)
}

// Close implements signer.Signer: it stops reconnecting, waits for
// signatures in progress, closes the sessions and unloads the module when
// no other Signer uses it.
func (s *Signer) Close() error {
	if s.shutdown() {
		s.mods.release(s.mod)
	}
	return nil
}

// shutdown does Close's work except releasing the module. It reports
// whether this call closed the Signer.
func (s *Signer) shutdown() bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	s.closed = true
	stop, done, recovering := s.stop, s.done, s.recovering
	s.mu.Unlock()
	if recovering {
		close(stop)
		<-done
	}
	// Wait for signatures in flight: they hold sem slots.
	for i := 0; i < cap(s.sem); i++ {
		s.sem <- struct{}{}
	}
	s.mu.Lock()
	idle, c, healthy := s.idle, s.conn, s.healthy
	s.idle = nil
	s.healthy = false
	s.mu.Unlock()
	for _, sess := range idle {
		s.closeSession(sess.h, sess.modGen)
	}
	if healthy {
		s.closeSession(c.anchor, c.modGen)
		s.mod.setHealthy(-1)
	}
	for i := 0; i < cap(s.sem); i++ {
		<-s.sem
	}
	return true
}

// selfTest signs a fixed message and verifies it with the public key, so
// that a public key object that does not belong to the private key is
// caught at open, not at the first certificate.
func (s *Signer) selfTest() error {
	return signAndVerify(s, []byte(selfTestMessage))
}

func signAndVerify(s crypto.Signer, msg []byte) error {
	pub := s.Public()
	var opts crypto.SignerOpts = crypto.SHA256
	d := msg
	if _, ok := pub.(ed25519.PublicKey); ok {
		opts = crypto.Hash(0)
	} else {
		sum := sha256.Sum256(msg)
		d = sum[:]
	}
	sig, err := s.Sign(rand.Reader, d, opts)
	if err != nil {
		return fmt.Errorf("pkcs11: self-test signature: %w", err)
	}
	ok := false
	switch k := pub.(type) {
	case ed25519.PublicKey:
		ok = ed25519.Verify(k, d, sig)
	case *ecdsa.PublicKey:
		ok = ecdsa.VerifyASN1(k, d, sig)
	case *rsa.PublicKey:
		ok = rsa.VerifyPKCS1v15(k, crypto.SHA256, d, sig) == nil
	}
	if !ok {
		return errors.New("pkcs11: self-test signature does not verify with the public key found for the private key (mismatched public key object?)")
	}
	return nil
}
