package tpm_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// loadedSessions lists the sessions loaded in the simulator
// (TPM2_GetCapability(TPM_CAP_HANDLES) over the HMAC and policy session
// ranges).
func loadedSessions(t *testing.T, sim *tpmsim.Simulator) []tpm2.TPMHandle {
	t.Helper()
	hs, err := tpm.LoadedHandles(sim.TPM())
	if err != nil {
		t.Fatal(err)
	}
	var out []tpm2.TPMHandle
	for _, h := range hs {
		if ht := tpm2.TPMHT(uint32(h) >> 24); ht == tpm2.TPMHTHMACSession || ht == tpm2.TPMHTPolicySession {
			out = append(out, h)
		}
	}
	return out
}

// lateTPM answers the next command with code stall only after hold, as a
// device whose read Close does not interrupt answers late: the TPM has
// executed the command, and the operation that sent it has been abandoned
// by the timeout by then. Lock-free, so that the race detector sees what
// the signer alone synchronizes.
type lateTPM struct {
	transport.TPMCloser
	hold  time.Duration
	stall *atomic.Uint32 // command code to hold back once; 0 = none
}

func (l lateTPM) Send(cmd []byte) ([]byte, error) {
	rsp, err := l.TPMCloser.Send(cmd)
	if len(cmd) >= 10 && l.stall.CompareAndSwap(binary.BigEndian.Uint32(cmd[6:10]), 0) {
		time.Sleep(l.hold)
	}
	return rsp, err
}

// Close leaves the simulator connection usable, as closing a device file
// with a read in progress releases it only when the read returns.
func (lateTPM) Close() error { return nil }

func signOnce(s signer.Signer) error {
	d := sha256.Sum256([]byte("csr"))
	sig, err := s.Sign(nil, d[:], crypto.SHA256)
	if err == nil && !ecdsa.VerifyASN1(s.Public().(*ecdsa.PublicKey), d[:], sig) {
		return errors.New("signature does not verify")
	}
	return err
}

// TestAbandonedSignLeaksNoSession: a signature abandoned by the timeout
// whose TPM answer comes late — at StartAuthSession, at PolicyPCR (its
// kept session), at Sign — must not leave a session loaded nor replace
// the kept session of the connection that replaced its own, on a TPM
// without a resource manager (the simulator here, /dev/tpm0 on a host)
// where nothing else flushes it: after each round exactly one session is
// loaded, the one kept for the next signature. Before the kept session
// had its own lock, the late StartAuthSession overwrote the new
// connection's session, which stayed loaded for good (and -race reported
// the unsynchronized write).
func TestAbandonedSignLeaksNoSession(t *testing.T) {
	sim := tpmsim.NewSimulator(t)
	// The bound must cover a key load and a signature on a loaded 2-core
	// machine under -race; the hold outlasts it.
	const bound, hold = 750 * time.Millisecond, 1200 * time.Millisecond
	stall := &atomic.Uint32{}
	b := &tpm.Backend{RetryInterval: time.Millisecond, Dial: func(ctx context.Context, d tpm.Device) (transport.TPMCloser, error) {
		c, err := sim.Dial(ctx, d)
		return lateTPM{TPMCloser: c, hold: hold, stall: stall}, err
	}}
	const uri = "tpm:handle=0x81000101;socket=/unused;timeout=750ms"
	s, err := b.Generate(ctx, uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { evictPersistent(t, sim, s, 0x81000101) })
	for _, late := range []struct {
		name string
		cc   tpm2.TPMCC
	}{
		{"StartAuthSession", tpm2.TPMCCStartAuthSession},
		{"PolicyPCR", tpm2.TPMCCPolicyPCR},
		{"Sign", tpm2.TPMCCSign},
		{"StartAuthSession again", tpm2.TPMCCStartAuthSession},
	} {
		cc := late.cc
		if cc == tpm2.TPMCCStartAuthSession {
			// The next signature starts a session: drop the kept one by
			// making the TPM forget it.
			flushSessions(t, sim)
		}
		stall.Store(uint32(cc))
		if err := signOnce(s); !errors.Is(err, signer.ErrDeviceUnavailable) {
			t.Fatalf("%s held back past the timeout: %v, want ErrDeviceUnavailable", late.name, err)
		}
		time.Sleep(2 * time.Millisecond) // the retry interval
		if err := signOnce(s); err != nil {
			t.Fatalf("after the timeout at %s: %v", late.name, err)
		}
		time.Sleep(hold - bound + 200*time.Millisecond) // the abandoned signature ends
		if err := signOnce(s); err != nil {
			t.Fatalf("after the abandoned signature at %s ended: %v", late.name, err)
		}
		if got := loadedSessions(t, sim); len(got) != 1 {
			t.Fatalf("after a signature abandoned at %s: %d sessions loaded (%#x), want 1 (the kept one)", late.name, len(got), got)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := loadedSessions(t, sim); len(got) != 0 {
		t.Fatalf("after Close: sessions %#x loaded", got)
	}
}

// flushSessions flushes every session loaded in the simulator, as another
// client of a TPM without a resource manager may.
func flushSessions(t *testing.T, sim *tpmsim.Simulator) {
	t.Helper()
	flushHandles(t, sim, loadedSessions(t, sim))
}

// flushHandles flushes hs from the simulator, as another client of a TPM
// without a resource manager (or a reset) would.
func flushHandles(t *testing.T, sim *tpmsim.Simulator, hs []tpm2.TPMHandle) {
	t.Helper()
	for _, h := range hs {
		if _, err := (tpm2.FlushContext{FlushHandle: h}).Execute(sim.TPM()); err != nil {
			t.Fatal(err)
		}
	}
}

// simSigner is a new blob key on a fresh simulator with the URI
// attributes attrs, closed when the test ends.
func simSigner(t *testing.T, attrs string) (*tpmsim.Simulator, signer.Signer) {
	t.Helper()
	sim := tpmsim.NewSimulator(t)
	b := &tpm.Backend{Dial: sim.Dial}
	s, err := b.Generate(ctx, blobURI(t, attrs), signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return sim, s
}

func evictPersistent(t *testing.T, sim *tpmsim.Simulator, s signer.Signer, h tpm2.TPMHandle) {
	t.Helper()
	s.Close()
	_, err := tpm2.EvictControl{
		Auth:             tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
		ObjectHandle:     tpm2.NamedHandle{Handle: h, Name: mustName(t, s)},
		PersistentHandle: h,
	}.Execute(sim.TPM())
	if err != nil {
		t.Errorf("evict: %v", err)
	}
}

// TestLostSessionIsReplaced: when the kept policy session is gone (flushed
// by another client of the device, or the TPM was reset), the signature
// does not fail: it runs once more on a fresh session.
func TestLostSessionIsReplaced(t *testing.T) {
	sim, s := simSigner(t, "")
	for range 3 {
		if err := signOnce(s); err != nil {
			t.Fatal(err)
		}
		flushSessions(t, sim)
	}
	if err := signOnce(s); err != nil {
		t.Fatalf("Sign after the kept session was flushed: %v", err)
	}
	if got := loadedSessions(t, sim); len(got) != 1 {
		t.Fatalf("%d sessions loaded, want 1", len(got))
	}
}

// TestTwoConnections: with connections=2 concurrent signatures run on two
// connections, each with the key loaded and its own kept session (two
// sessions at most on the TPM), and Close leaves nothing loaded (the
// simulator's cleanup checks).
func TestTwoConnections(t *testing.T) {
	sim, s := simSigner(t, "connections=2")
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for range 5 {
				if err := signOnce(s); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := loadedSessions(t, sim); len(got) != 2 {
		t.Fatalf("%d sessions loaded after concurrent signatures, want 2 (one kept per connection)", len(got))
	}
}

// TestLostKeyIsReloaded: when the TPM lost the loaded key and the kept
// session (another client of a TPM without a resource manager flushed
// every handle, as a reset would), the signature does not fail: the
// connection is redone, the key reloaded, and it runs once more.
func TestLostKeyIsReloaded(t *testing.T) {
	sim, s := simSigner(t, "")
	for range 3 {
		hs, err := tpm.LoadedHandles(sim.TPM())
		if err != nil {
			t.Fatal(err)
		}
		flushHandles(t, sim, hs)
		if err := signOnce(s); err != nil {
			t.Fatalf("Sign after the TPM lost the key and session: %v", err)
		}
	}
}
