package tpm

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// Signer signs with a key held in a TPM. It keeps one or two connections
// (lanes) with the key loaded between signatures, one operation at a time
// on each, and reconnects and reloads the key by itself after the TPM
// went away.
type Signer struct {
	dial    DialFunc
	logger  *slog.Logger
	retry   time.Duration
	uri     KeyURI
	km      *keyMaterial
	pub     *ecdsa.PublicKey
	size    int // curve order size in bytes
	name    tpm2.TPM2BName
	policy  []byte // the key's authPolicy
	desc    signer.Description
	pcrDesc string

	lanes  []*lane
	free   chan *lane // the lanes not in use
	closed atomic.Bool

	stateMu     sync.Mutex // guards policyState
	policyState int        // 0 unknown, 1 satisfied, 2 not satisfied
	auth        authorizedState
}

func (b *Backend) newSigner(ctx context.Context, u KeyURI, km *keyMaterial) (*Signer, error) {
	retry := b.RetryInterval
	if retry <= 0 {
		retry = DefaultRetryInterval
	}
	s := &Signer{dial: b.Dial, logger: b.logger(), retry: retry, uri: u, km: km}
	s.lanes, s.free = newLanes(max(u.Connections, 1))
	if km.blob != nil {
		pub, err := km.blob.Public.Contents()
		if err != nil {
			return nil, fmt.Errorf("tpm: key blob: %w", err)
		}
		if err := s.setPublic(pub); err != nil {
			return nil, err
		}
	}
	conn, err := b.dial(ctx, u)
	if err != nil {
		return nil, err
	}
	var key tpm2.TPMHandle
	_, err = runBounded(ctx, conn, u.Timeout, func(t transport.TPM) error {
		var err error
		key, err = s.loadKey(t)
		return err
	})
	if err != nil {
		err = errors.Join(err, conn.Close())
		return nil, fmt.Errorf("tpm: open %s: %w", u, err)
	}
	// The first lane is connected now, so that Open fails on a key that
	// cannot load; the others connect when first used.
	s.lanes[0].conn, s.lanes[0].key, s.lanes[0].up = conn, key, true
	return s, nil
}

// setPublic records the key's public area and builds its description.
func (s *Signer) setPublic(p *tpm2.TPMTPublic) error {
	pub, err := tpmpolicy.CheckKeyPublic(p)
	if err != nil {
		return fmt.Errorf("tpm: %s: %w", s.uri, err)
	}
	name, err := tpm2.ObjectName(p)
	if err != nil {
		return fmt.Errorf("tpm: key name: %w", err)
	}
	fp, err := signer.Fingerprint(pub)
	if err != nil {
		return err
	}
	s.pub, s.name, s.policy = pub, *name, p.AuthPolicy.Buffer
	s.size = (pub.Params().N.BitLen() + 7) / 8
	s.pcrDesc = "sha256:" + tpmpolicy.PCRList(s.km.pcrs)
	s.desc = signer.Description{
		Backend:      Scheme,
		Algorithm:    signer.AlgorithmName(pub),
		Fingerprint:  fp,
		Extractable:  false,
		Policy:       s.policyDesc(),
		PolicyDigest: hex.EncodeToString(p.AuthPolicy.Buffer),
		Location:     s.uri.String(),
	}
	return nil
}

// policyDesc names the key's policy for Describe.
func (s *Signer) policyDesc() string {
	if len(s.km.authorities) == 0 {
		return "pcr " + s.pcrDesc + " + CC_Sign"
	}
	fps := make([]string, len(s.km.authorities))
	for i, a := range s.km.authorities {
		fps[i] = a.Fingerprint()
	}
	return "authorized by " + strings.Join(fps, " | ") + " (" + s.km.binding.String() + ") + CC_Sign; approvals " + s.uri.Approvals
}

// loadKey makes the key usable on a fresh connection: a blob is loaded
// under the recreated SRK, a persistent handle is read and checked to be
// the key first opened.
func (s *Signer) loadKey(t transport.TPM) (tpm2.TPMHandle, error) {
	if s.km.blob != nil {
		h, name, err := loadBlob(t, s.km.blob)
		if err != nil && reclaimStale(t, s.uri.Device, err, s.logger) {
			h, name, err = loadBlob(t, s.km.blob)
		}
		if err != nil {
			var rc tpm2.TPMRC
			if errors.As(err, &rc) && (errors.Is(rc, tpm2.TPMRCIntegrity) || errors.Is(rc, tpm2.TPMRCSize) || errors.Is(rc, tpm2.TPMRCValue)) {
				return 0, fmt.Errorf("the key blob was not made by this TPM's storage root key (another TPM, or the owner hierarchy was cleared): %w", err)
			}
			return 0, err
		}
		if !bytes.Equal(name.Buffer, s.name.Buffer) {
			flush(t, h)
			return 0, errors.New("the loaded key's name differs from the blob's public area")
		}
		return h, nil
	}
	rsp, err := tpm2.ReadPublic{ObjectHandle: s.uri.Handle}.Execute(t)
	if err != nil {
		if errors.Is(err, tpm2.TPMRCHandle) {
			return 0, fmt.Errorf("persistent handle 0x%08x holds no key: %w: %w", uint32(s.uri.Handle), signer.ErrKeyNotFound, err)
		}
		return 0, fmt.Errorf("read key at 0x%08x (TPM2_ReadPublic): %w", uint32(s.uri.Handle), err)
	}
	if s.pub == nil {
		pub, err := rsp.OutPublic.Contents()
		if err != nil {
			return 0, err
		}
		if err := s.setPublic(pub); err != nil {
			return 0, err
		}
	} else if !bytes.Equal(rsp.Name.Buffer, s.name.Buffer) {
		return 0, fmt.Errorf("persistent handle 0x%08x now holds a different key", uint32(s.uri.Handle))
	}
	return s.uri.Handle, nil
}

// ensure connects ln and loads the key on it if it is disconnected. It
// tries at most once per retry interval; in between it fails at once.
func (s *Signer) ensure(ctx context.Context, ln *lane) error {
	if s.closed.Load() {
		return fmt.Errorf("tpm: signer is closed: %w", signer.ErrDeviceUnavailable)
	}
	if ln.conn != nil {
		return nil
	}
	if !ln.lastAttempt.IsZero() && time.Since(ln.lastAttempt) < s.retry {
		return ln.lastErr
	}
	ln.lastAttempt = time.Now()
	conn, err := s.dialURI(ctx)
	if err != nil {
		ln.lastErr = err
		return err
	}
	var key tpm2.TPMHandle
	_, err = runBounded(ctx, conn, s.uri.Timeout, func(t transport.TPM) error {
		var err error
		key, err = s.loadKey(t)
		return err
	})
	if err != nil {
		_ = conn.Close() // it failed; err says why
		ln.lastErr = fmt.Errorf("tpm: reconnect %s: %w: %w", s.uri.Device, signer.ErrDeviceUnavailable, err)
		return ln.lastErr
	}
	ln.conn, ln.key, ln.lastErr = conn, key, nil
	if !ln.up {
		ln.up = true
		s.logger.Info("tpm: device is back, key reloaded", "location", s.desc.Location, "connection", ln.index)
	}
	return nil
}

func (s *Signer) dialURI(ctx context.Context) (transport.TPMCloser, error) {
	ctx, cancel := context.WithTimeout(ctx, s.uri.Timeout)
	defer cancel()
	conn, err := s.dial(ctx, s.uri.Device)
	if err != nil {
		return nil, fmt.Errorf("tpm: open %s: %w: %w", s.uri.Device, signer.ErrDeviceUnavailable, err)
	}
	return conn, nil
}

// drop forgets ln's connection after it failed; the next use reconnects.
// Its kept session is not flushed: the connection is dead, or the TPM
// lost its handles; an operation still running on it (abandoned by the
// timeout) flushes the session it holds when it ends.
func (s *Signer) drop(ln *lane, cause error) {
	if ln.conn != nil {
		_ = ln.conn.Close() // it failed; cause says why
	}
	ln.sess.reset()
	ln.conn, ln.key = nil, 0
	ln.lastAttempt = time.Time{}
	if ln.up {
		ln.up = false
		s.logger.Warn("tpm: device unavailable; requests fail until it is back", "location", s.desc.Location, "connection", ln.index, "error", cause)
	}
}

// laneOp is an operation on a lane: t is the lane's connection, at what
// it holds when the operation starts.
type laneOp func(t transport.TPM, at laneState) error

// laneState is a lane's key handle and connection generation for one
// operation, taken while the operation owns the lane: an abandoned
// operation keeps using these values, never the lane's fields.
type laneState struct {
	ln  *lane
	key tpm2.TPMHandle
	gen uint64
}

// do runs op on a free lane with the key loaded. policyOp says that op's
// success proves the policy satisfied (Sign, CheckPolicy), for the
// once-per-change policy log.
func (s *Signer) do(ctx context.Context, policyOp bool, op laneOp) error {
	ln, err := s.take(ctx)
	if err != nil {
		return err
	}
	defer s.give(ln)
	if err := s.ensure(ctx, ln); err != nil {
		return err
	}
	at := laneState{ln: ln, key: ln.key, gen: ln.sess.generation()}
	dead, err := runBounded(ctx, ln.conn, s.uri.Timeout, func(t transport.TPM) error { return op(t, at) })
	err = s.afterOp(ln, dead, err)
	if errors.Is(err, signer.ErrPolicyNotSatisfied) {
		s.setPolicyState(false, err)
	} else if err == nil && policyOp {
		s.setPolicyState(true, nil)
	}
	return err
}

// afterOp drops the lane's connection when the device or the key is gone,
// and names a PCR change during the operation as a policy failure.
func (s *Signer) afterOp(ln *lane, dead bool, err error) error {
	switch {
	case dead:
		s.drop(ln, err)
	case errors.Is(err, errCounterGone):
		// The revocation counter's handle, not the key's: keep both.
	case errors.Is(err, tpm2.TPMRCHandle) || errors.Is(err, tpm2.TPMRCReferenceH0):
		// The TPM lost the loaded key (a reset behind a connection that
		// survived it, or another client of a TPM without a resource
		// manager flushed it): reload on the next call.
		s.drop(ln, err)
		err = fmt.Errorf("%w: %w: %w", signer.ErrDeviceUnavailable, errKeyLost, err)
	case errors.Is(err, tpm2.TPMRCPCRChanged) && !errors.Is(err, signer.ErrPolicyNotSatisfied):
		// A PCR changed between TPM2_PolicyPCR and TPM2_Sign (TPM 2.0
		// Part 3 §23.7): the boot state moved under the key's policy.
		err = s.policyErr(err)
	}
	return err
}

func (s *Signer) setPolicyState(ok bool, err error) {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	state := 2
	if ok {
		state = 1
	}
	if state == s.policyState {
		return
	}
	prev := s.policyState
	s.policyState = state
	switch {
	case !ok && len(s.km.authorities) > 0:
		s.logger.Error("tpm: no approval covers the current PCR state; signing is refused until an approval of this state is added to the approvals directory (no restart needed)",
			"location", s.desc.Location, "policy", s.desc.Policy, "error", err)
	case !ok:
		s.logger.Error("tpm: key use policy not satisfied; signing is refused until the PCRs match again",
			"location", s.desc.Location, "policy", s.desc.Policy, "error", err)
	case prev == 2:
		s.logger.Info("tpm: key use policy satisfied again", "location", s.desc.Location)
	}
}

// policyErr reports that the PCRs do not match the key's policy, keeping
// the TPM response code (if any) in the chain.
func (s *Signer) policyErr(rc error) error {
	msg := fmt.Sprintf("tpm: PCR policy not satisfied: the %s PCR values differ from those the key is bound to", s.pcrDesc)
	if s.uri.Handle != 0 && !s.uri.PCRsSet {
		// A persistent key records no PCR selection (a blob does), so a
		// URI without pcrs= assumed the default, which may not be the
		// selection the key was made with.
		msg = fmt.Sprintf("tpm: PCR policy not satisfied for the persistent key at 0x%08x: this handle= URI names no pcrs=, so %s was assumed, and a persistent key does not record the PCRs it is bound to; add pcrs= with the PCRs the key was created with (e.g. pcrs=7,11) — if they are right, the PCR values changed since the key was created", uint32(s.uri.Handle), s.pcrDesc)
	}
	if len(s.km.authorities) > 0 {
		msg = "tpm: signed PCR policy not satisfied: the PCRs changed during the signature; the next one looks for an approval of the new state"
	}
	if rc == nil {
		return fmt.Errorf("%s: %w", msg, signer.ErrPolicyNotSatisfied)
	}
	return fmt.Errorf("%s: %w: %w", msg, signer.ErrPolicyNotSatisfied, rc)
}

// runPolicy runs the key's policy in a policy session. With the expected
// PCR digest known (blob keys), a PCR change fails TPM2_PolicyPCR with
// TPM_RC_VALUE (TPM 2.0 Part 3 §23.7); without it (persistent keys), the
// session digest just ends up wrong and TPM2_Sign fails with
// TPM_RC_POLICY_FAIL.
func (s *Signer) runPolicy(t transport.TPM, sess tpm2.TPMHandle) error {
	if len(s.km.authorities) > 0 {
		return s.runAuthorized(t, sess)
	}
	_, err := tpm2.PolicyPCR{
		PolicySession: sess,
		PcrDigest:     tpm2.TPM2BDigest{Buffer: s.km.pcrDigest},
		Pcrs:          tpmpolicy.PCRSelection(s.km.pcrs),
	}.Execute(t)
	if err != nil {
		if errors.Is(err, tpm2.TPMRCValue) {
			return s.policyErr(err)
		}
		return fmt.Errorf("TPM2_PolicyPCR: %w", err)
	}
	if _, err := (tpm2.PolicyCommandCode{PolicySession: sess, Code: tpm2.TPMCCSign}).Execute(t); err != nil {
		return fmt.Errorf("TPM2_PolicyCommandCode: %w", err)
	}
	return nil
}

// tpmDigest prepares a digest for TPM2_Sign. ECDSA uses only the leftmost
// bits of the digest, as many as the curve order has (FIPS 186-5 §6.4.1,
// SEC 1 §4.1.3 step 5), and TPM2_Sign insists that the digest be exactly as
// long as the scheme's hash. So a longer digest is cut to the order size
// and labelled with the hash of that size; the signature is the same, and a
// TPM only needs SHA-256 (and SHA-384 for P-384) to serve SHA-384/512
// signature requests.
func (s *Signer) tpmDigest(d []byte) ([]byte, tpm2.TPMIAlgHash) {
	if len(d) > s.size {
		d = d[:s.size]
	}
	if len(d) == 48 {
		return d, tpm2.TPMAlgSHA384
	}
	return d, tpm2.TPMAlgSHA256
}

// Public implements crypto.Signer.
func (s *Signer) Public() crypto.PublicKey { return s.pub }

// Describe implements signer.Signer.
func (s *Signer) Describe() signer.Description { return s.desc }

// Sign implements crypto.Signer: an ASN.1 ECDSA signature by the TPM over
// digest, after the key's policy session. It fails with an error wrapping
// signer.ErrPolicyNotSatisfied (and the TPM response code) when the PCRs
// changed, and signer.ErrDeviceUnavailable when the TPM cannot be reached.
// rand is not used: the TPM draws its own nonce.
func (s *Signer) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if err := signer.CheckOpts(s.pub, digest, opts); err != nil {
		return nil, err
	}
	d, hashAlg := s.tpmDigest(digest)
	var r, sv []byte
	op := func(t transport.TPM, at laneState) error {
		var err error
		r, sv, err = s.signOp(t, at, d, hashAlg)
		if sessionLost(err) {
			// The kept session is gone (flushed by someone with access
			// to the device, or the TPM was reset): signOp let it go;
			// once more on a fresh one.
			r, sv, err = s.signOp(t, at, d, hashAlg)
		}
		return err
	}
	err := s.do(context.Background(), true, op)
	if errors.Is(err, errKeyLost) {
		// The connection still works: once more with the key reloaded.
		err = s.do(context.Background(), true, op)
	}
	if err != nil {
		return nil, err
	}
	return encodeSig(r, sv)
}

// errKeyLost marks a failure because the TPM no longer had the loaded
// key; the connection was dropped to reload it.
var errKeyLost = errors.New("the TPM no longer holds the loaded key; it is reloaded")

// sessionLost reports an error that says the kept policy session is no
// longer loaded: TPM_RC_REFERENCE_H0 from a policy command (whose first
// handle is the session) or TPM_RC_REFERENCE_S0 from TPM2_Sign (whose
// first authorization is). A lost key gives TPM_RC_REFERENCE_H0 from
// TPM2_Sign too: the retry then fails the same way, and do drops the
// connection to reload it.
func sessionLost(err error) bool {
	return errors.Is(err, tpm2.TPMRCReferenceH0) || errors.Is(err, tpm2.TPMRCReferenceS0)
}

func (s *Signer) signOp(t transport.TPM, at laneState, d []byte, hashAlg tpm2.TPMIAlgHash) (r, sv []byte, err error) {
	sess, err := s.keptSession(t, at)
	if err != nil {
		return nil, nil, err
	}
	// A failure may leave the session half-way through the policy: it is
	// flushed, and the next signature starts a fresh one. A session whose
	// connection was dropped while this ran is flushed too.
	defer func() {
		if at.ln.sess.settle(at.gen, sess, err != nil) {
			flush(t, sess.Handle())
		}
	}()
	if err := s.runPolicy(t, sess.Handle()); err != nil {
		return nil, nil, err
	}
	rsp, err := tpm2.Sign{
		KeyHandle: tpm2.AuthHandle{Handle: at.key, Name: s.name, Auth: sess},
		Digest:    tpm2.TPM2BDigest{Buffer: d},
		InScheme: tpm2.TPMTSigScheme{
			Scheme:  tpm2.TPMAlgECDSA,
			Details: tpm2.NewTPMUSigScheme(tpm2.TPMAlgECDSA, &tpm2.TPMSSchemeHash{HashAlg: hashAlg}),
		},
		Validation: tpm2.TPMTTKHashCheck{Tag: tpm2.TPMSTHashCheck, Hierarchy: tpm2.TPMRHNull},
	}.Execute(t)
	if err != nil {
		if errors.Is(err, tpm2.TPMRCPolicyFail) {
			return nil, nil, s.policyErr(err)
		}
		return nil, nil, fmt.Errorf("TPM2_Sign: %w", err)
	}
	ecc, err := rsp.Signature.Signature.ECDSA()
	if err != nil {
		return nil, nil, fmt.Errorf("TPM2_Sign returned no ECDSA signature: %w", err)
	}
	return ecc.SignatureR.Buffer, ecc.SignatureS.Buffer, nil
}

// keptSession returns the policy session the lane keeps for signing,
// starting one if needed. go-tpm's policy sessions have continueSession
// set, and a policy session that authorizes a command with
// continueSession SET is reset to its initial policy state afterwards
// (TPM 2.0 Part 1, policy session lifecycle; libtpms, i.e. swtpm, does
// so, and the conformance suite signs many times on one session). So one
// session serves signature after signature with PolicyPCR,
// PolicyCommandCode and Sign: three commands instead of five with
// StartAuthSession and FlushContext each time. A PCR that changes
// between PolicyPCR and Sign makes Sign fail with TPM_RC_PCR_CHANGED; the
// session is then discarded like after any failure.
func (s *Signer) keptSession(t transport.TPM, at laneState) (tpm2.Session, error) {
	if sess := at.ln.sess.get(at.gen); sess != nil {
		return sess, nil
	}
	sess, _, err := tpm2.PolicySession(t, tpm2.TPMAlgSHA256, 16)
	if err != nil {
		return nil, fmt.Errorf("start policy session (TPM2_StartAuthSession): %w", err)
	}
	if !at.ln.sess.keep(at.gen, sess) {
		// The connection was dropped while the session started (this
		// operation was abandoned by the timeout): nobody else flushes it.
		flush(t, sess.Handle())
		return nil, fmt.Errorf("start policy session: %w: the connection was dropped", signer.ErrDeviceUnavailable)
	}
	return sess, nil
}

// encodeSig encodes r and s as an ASN.1 ECDSA-Sig-Value (RFC 3279 §2.2.3).
func encodeSig(r, s []byte) ([]byte, error) {
	der, err := asn1.Marshal(struct{ R, S *big.Int }{new(big.Int).SetBytes(r), new(big.Int).SetBytes(s)})
	if err != nil {
		return nil, fmt.Errorf("tpm: encode signature: %w", err)
	}
	return der, nil
}

// CheckPolicy tells, without signing, whether the TPM's PCRs currently
// satisfy the key's policy: nil, or an error wrapping
// signer.ErrPolicyNotSatisfied (or signer.ErrDeviceUnavailable).
func (s *Signer) CheckPolicy(ctx context.Context) error {
	return s.do(ctx, true, func(t transport.TPM, _ laneState) error {
		sess, closeSess, err := tpm2.PolicySession(t, tpm2.TPMAlgSHA256, 16)
		if err != nil {
			return fmt.Errorf("start policy session (TPM2_StartAuthSession): %w", err)
		}
		defer closeSess() //nolint:errcheck // see signOp
		if err := s.runPolicy(t, sess.Handle()); err != nil {
			return err
		}
		rsp, err := tpm2.PolicyGetDigest{PolicySession: sess.Handle()}.Execute(t)
		if err != nil {
			return fmt.Errorf("TPM2_PolicyGetDigest: %w", err)
		}
		if !bytes.Equal(rsp.PolicyDigest.Buffer, s.policy) {
			return s.policyErr(nil)
		}
		return nil
	})
}

// PCRValues reads the current sha256 values of the PCRs the key is bound
// to, by index.
func (s *Signer) PCRValues(ctx context.Context) (map[int][]byte, error) {
	var vals [][]byte
	err := s.do(ctx, false, func(t transport.TPM, _ laneState) error {
		var err error
		vals, err = ReadPCRs(t, s.km.pcrs)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make(map[int][]byte, len(vals))
	for i, p := range s.km.pcrs {
		out[p] = vals[i]
	}
	return out, nil
}

// PCRs returns the sha256 PCR indices the key is bound to.
func (s *Signer) PCRs() []int { return append([]int(nil), s.km.pcrs...) }

// Close flushes the loaded key and the kept session on each connection
// and closes them, after the operations in progress end. The key itself
// (blob file or persistent handle) is untouched.
func (s *Signer) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	var errs []error
	for range s.lanes {
		ln := <-s.free
		errs = append(errs, s.closeLane(ln))
		defer s.give(ln) // later calls find a lane and fail: closed
	}
	return errors.Join(errs...)
}

func (s *Signer) closeLane(ln *lane) error {
	if ln.conn == nil {
		return nil
	}
	sess := ln.sess.reset()
	runBounded(context.Background(), ln.conn, s.uri.Timeout, func(t transport.TPM) error { //nolint:errcheck // the connection is closed right after
		if sess != nil {
			flush(t, sess.Handle())
		}
		if s.km.blob != nil && ln.key != 0 {
			flush(t, ln.key)
		}
		return nil
	})
	err := ln.conn.Close()
	ln.conn, ln.key = nil, 0
	return err
}
