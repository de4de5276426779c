package tpm_test

import (
	"crypto"
	"crypto/sha256"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/signertest"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

func swtpmKey(t *testing.T, sw *tpmsim.Swtpm, b *tpm.Backend, pcrs string) (*tpm.Signer, string) {
	t.Helper()
	uri := "tpm:path=" + filepath.Join(t.TempDir(), "ca.tpmkey") + ";" + sw.URIAttrs() + ";timeout=5s"
	if pcrs != "" {
		uri += ";pcrs=" + pcrs
	}
	s, err := b.Generate(ctx, uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	return s.(*tpm.Signer), uri
}

func TestSwtpmConformance(t *testing.T) {
	for _, tcp := range []bool{false, true} {
		name := "unix"
		if tcp {
			name = "tcp"
		}
		t.Run(name, func(t *testing.T) {
			sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{TCP: tcp})
			b := &tpm.Backend{Dial: tpmsim.Dial}
			s, _ := swtpmKey(t, sw, b, "7,11")
			defer s.Close()
			signertest.Run(t, s, signertest.Options{})
		})
	}
	t.Run("p384", func(t *testing.T) {
		sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
		b := &tpm.Backend{Dial: tpmsim.Dial}
		uri := "tpm:path=" + filepath.Join(t.TempDir(), "ca.tpmkey") + ";" + sw.URIAttrs()
		s, err := b.Generate(ctx, uri, signer.ECDSAP384)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		signertest.Run(t, s, signertest.Options{Concurrency: 2, SignaturesPerGoroutine: 2})
	})
}

func sign(s signer.Signer) error {
	d := sha256.Sum256([]byte("steward"))
	_, err := s.Sign(nil, d[:], crypto.SHA256)
	return err
}

// eventually retries f until it succeeds or 15s pass; reconnection is
// rate-limited, so recovery takes a retry interval or two.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after 15s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestSwtpmPCRExtendThenRestart(t *testing.T) {
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	b := &tpm.Backend{Dial: tpmsim.Dial, RetryInterval: 100 * time.Millisecond}
	s, _ := swtpmKey(t, sw, b, "7,11")
	defer s.Close()
	if err := sign(s); err != nil {
		t.Fatal(err)
	}
	sw.ExtendPCR(t, 7, []byte("shim, then an unexpected bootloader"))
	err := sign(s)
	if !errors.Is(err, signer.ErrPolicyNotSatisfied) || !errors.Is(err, tpm2.TPMRCValue) {
		t.Fatalf("Sign after PCR extend = %v, want ErrPolicyNotSatisfied with TPM_RC_VALUE", err)
	}
	if err := s.CheckPolicy(ctx); !errors.Is(err, signer.ErrPolicyNotSatisfied) {
		t.Fatalf("CheckPolicy = %v", err)
	}
	// A reboot (swtpm restart, startup-clear) resets the PCRs: the same
	// signer recovers without being reopened.
	sw.Restart(t)
	eventually(t, "sign after swtpm restart", func() error { return sign(s) })
	if err := s.CheckPolicy(ctx); err != nil {
		t.Fatalf("CheckPolicy after restart = %v", err)
	}
}

func TestSwtpmBlobBoundToItsTPM(t *testing.T) {
	sw1 := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	sw2 := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	b := &tpm.Backend{Dial: tpmsim.Dial}
	s, uri := swtpmKey(t, sw1, b, "")
	s.Close()
	other := uri[:len(uri)-len(sw1.URIAttrs()+";timeout=5s")] + sw2.URIAttrs()
	_, err := b.Open(ctx, other)
	if err == nil {
		t.Fatal("a key blob made by one swtpm loaded into another")
	}
	if !errors.Is(err, tpm2.TPMRCIntegrity) && !errors.Is(err, tpm2.TPMRCSize) && !errors.Is(err, tpm2.TPMRCValue) {
		t.Fatalf("Open on another TPM = %v, want a TPM integrity error", err)
	}
	t.Logf("second TPM refused the blob: %v", err)
	// The first TPM still loads it.
	s1, err := b.Open(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	if err := sign(s1); err != nil {
		t.Fatal(err)
	}
}

func TestSwtpmKilledUnderLoad(t *testing.T) {
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	b := &tpm.Backend{Dial: tpmsim.Dial, RetryInterval: 100 * time.Millisecond}
	s, _ := swtpmKey(t, sw, b, "")
	defer s.Close()

	var ok, unavailable, other atomic.Int64
	var otherErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				switch err := sign(s); {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, signer.ErrDeviceUnavailable):
					unavailable.Add(1)
				default:
					other.Add(1)
					otherErr.Store(err)
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	sw.Kill()
	// While swtpm is down every request fails fast as unavailable.
	time.Sleep(500 * time.Millisecond)
	okWhileDown := ok.Load()
	start := time.Now()
	if err := sign(s); !errors.Is(err, signer.ErrDeviceUnavailable) {
		t.Errorf("Sign while swtpm is down = %v, want ErrDeviceUnavailable", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Sign while down took %v; it must fail fast", d)
	}
	time.Sleep(200 * time.Millisecond)
	if ok.Load() != okWhileDown {
		t.Errorf("signatures succeeded while swtpm was killed")
	}
	sw.Restart(t)
	eventually(t, "sign after restart", func() error { return sign(s) })
	before := ok.Load()
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if ok.Load() == before {
		t.Error("no signature succeeded under load after the restart")
	}
	if n := other.Load(); n > 0 {
		t.Errorf("%d failures were neither success nor ErrDeviceUnavailable, e.g. %v", n, otherErr.Load())
	}
	if unavailable.Load() == 0 {
		t.Error("no request saw ErrDeviceUnavailable while swtpm was down")
	}
	t.Logf("ok=%d unavailable=%d", ok.Load(), unavailable.Load())
}

func TestSwtpmImportAndPersistent(t *testing.T) {
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	b := &tpm.Backend{Dial: tpmsim.Dial, RetryInterval: 100 * time.Millisecond}
	uri := "tpm:handle=0x81000123;" + sw.URIAttrs()
	s, err := b.Generate(ctx, uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// A persistent key survives a restart and the signer picks it up again.
	sw.Restart(t)
	eventually(t, "sign with persistent key after restart", func() error { return sign(s) })
}

// TestSwtpmReclaimsHandlesOfDeadClients: swtpm has no resource manager
// and keeps transient objects across connections, so clients that died
// holding their key fill its three object slots. The next daemon must
// still open its key (flushing what the dead left), not fail with
// TPM_RC_OBJECT_MEMORY until someone restarts swtpm.
func TestSwtpmReclaimsHandlesOfDeadClients(t *testing.T) {
	// Without a resource manager: behind the relay's isolation another
	// client's objects are neither visible nor flushable.
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{NoResourceManager: true})
	b := &tpm.Backend{Dial: tpmsim.Dial}
	s, uri := swtpmKey(t, sw, b, "")
	s.Close()
	// Three "daemons" open the key and die without Close: their loaded
	// keys stay in the TPM.
	var dead []signer.Signer
	for i := 0; i < 4; i++ {
		d, err := b.Open(ctx, uri)
		if err != nil {
			t.Fatalf("open %d after dead clients filled the TPM: %v", i, err)
		}
		dead = append(dead, d)
	}
	last := dead[len(dead)-1]
	if err := sign(last); err != nil {
		t.Fatal(err)
	}
	// Only the newest client is alive; closing the others flushes
	// handles that may since have been reused, so close it last.
	for i := len(dead) - 2; i >= 0; i-- {
		dead[i].Close() //nolint:errcheck // their handles were reclaimed
	}
	last.Close() //nolint:errcheck
	sw.CheckNoLeaks(t)
}
