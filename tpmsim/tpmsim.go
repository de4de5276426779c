// Package tpmsim gives tests a TPM: the in-process Microsoft reference
// simulator (go-tpm-tools, cgo) and real swtpm processes, plus a check that
// a test leaked no TPM handles. It is test support: only tests and the
// end-to-end harness import it.
package tpmsim

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"

	"github.com/google/go-tpm-tools/simulator"
	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
	"github.com/google/go-tpm/tpmutil"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
)

// DevicesRequired reports whether tests must have swtpm and friends: in CI
// (CI=true) or when STEWARD_REQUIRE_DEVICES=1. Then a missing tool fails
// the test instead of skipping it.
func DevicesRequired() bool { return devtest.Required() }

// RequireTool returns the path of an executable, failing the test when it
// is missing and DevicesRequired, skipping it otherwise.
func RequireTool(tb testing.TB, name string) string {
	tb.Helper()
	return devtest.NeedTool(tb, name)
}

// Dial implements tpm.DialFunc for swtpm sockets (swtpm= and socket=);
// tests use it as the Backend's Dial. Character devices are refused: tests
// never touch the host's TPM.
func Dial(ctx context.Context, dev tpm.Device) (transport.TPMCloser, error) {
	network := ""
	switch dev.Kind {
	case tpm.DeviceTCP:
		network = "tcp"
	case tpm.DeviceUnix:
		network = "unix"
	default:
		return nil, fmt.Errorf("tpmsim dials swtpm sockets only, not %s", dev)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, dev.Addr)
	if err != nil {
		return nil, err
	}
	return tpm.NewStreamTransport(c), nil
}

// CheckNoLeaks fails tb if the TPM holds any transient object or any
// loaded or saved session: every handle a test (or the code under test)
// created must have been flushed.
func CheckNoLeaks(tb testing.TB, t transport.TPM) {
	tb.Helper()
	hs, err := tpm.LoadedHandles(t)
	if err != nil {
		tb.Errorf("list TPM handles: %v", err)
		return
	}
	if len(hs) > 0 {
		tb.Errorf("TPM handles leaked: %v", handleNames(hs))
	}
}

// ExtendPCR extends sha256 PCR idx with the SHA-256 of data (TPM2_PCR_Extend,
// TPM 2.0 Part 3 §22.2), as a measured boot would.
func ExtendPCR(t transport.TPM, idx int, data []byte) error {
	sum, err := tpm2.TPMAlgSHA256.Hash()
	if err != nil {
		return err
	}
	h := sum.New()
	h.Write(data)
	_, err = tpm2.PCRExtend{
		PCRHandle: tpm2.AuthHandle{Handle: tpm2.TPMHandle(idx), Auth: tpm2.PasswordAuth(nil)},
		Digests: tpm2.TPMLDigestValues{Digests: []tpm2.TPMTHA{{
			HashAlg: tpm2.TPMAlgSHA256,
			Digest:  h.Sum(nil),
		}}},
	}.Execute(t)
	if err != nil {
		return fmt.Errorf("extend PCR %d: %w", idx, err)
	}
	return nil
}

// Simulator is the in-process TPM simulator. Only one exists per process
// at a time (the C simulator is global); NewSimulator blocks until the
// previous one is closed.
type Simulator struct {
	mu     sync.Mutex
	sim    *simulator.Simulator
	closed bool
}

// NewSimulator starts a freshly manufactured simulator and registers its
// cleanup, which fails the test if handles leaked.
func NewSimulator(tb testing.TB) *Simulator {
	tb.Helper()
	sim, err := simulator.Get()
	if err != nil {
		tb.Fatalf("start TPM simulator: %v", err)
	}
	s := &Simulator{sim: sim}
	tb.Cleanup(func() {
		CheckNoLeaks(tb, s.TPM())
		s.Close()
	})
	return s
}

// Send implements transport.TPM, serialized.
func (s *Simulator) send(cmd []byte) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("tpmsim: simulator closed")
	}
	return tpmutil.RunCommandRaw(s.sim, cmd)
}

// TPM returns a transport to the simulator for test code.
func (s *Simulator) TPM() transport.TPM { return simConn{s: s} }

// Dial implements tpm.DialFunc: every connection shares the simulator, and
// closing one does not stop it.
func (s *Simulator) Dial(context.Context, tpm.Device) (transport.TPMCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("tpmsim: simulator closed")
	}
	return &simConn{s: s}, nil
}

// ExtendPCR extends a sha256 PCR, failing tb on error.
func (s *Simulator) ExtendPCR(tb testing.TB, idx int, data []byte) {
	tb.Helper()
	if err := ExtendPCR(s.TPM(), idx, data); err != nil {
		tb.Fatal(err)
	}
}

// Close stops the simulator. It is safe to call twice.
func (s *Simulator) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.sim.Close()
}

type simConn struct {
	s *Simulator
}

func (c simConn) Send(cmd []byte) ([]byte, error) { return c.s.send(cmd) }
func (c simConn) Close() error                    { return nil }

// handleNames formats handles for messages.
func handleNames(hs []tpm2.TPMHandle) []string {
	out := make([]string, 0, len(hs))
	for _, h := range hs {
		out = append(out, fmt.Sprintf("0x%08x", uint32(h)))
	}
	slices.Sort(out)
	return out
}

// ECCPublic is the TPMT_PUBLIC a TPM would present for the P-256
// ECDSA-SHA256 key pub with these attributes and authPolicy: what a
// forger writes around a software key (attestation tests).
func ECCPublic(pub *ecdsa.PublicKey, attrs tpm2.TPMAObject, authPolicy []byte) (tpm2.TPMTPublic, error) {
	point, err := pub.Bytes()
	if err != nil || len(point) != 65 {
		return tpm2.TPMTPublic{}, fmt.Errorf("not an uncompressed P-256 point: %w", err)
	}
	return tpm2.TPMTPublic{
		Type: tpm2.TPMAlgECC, NameAlg: tpm2.TPMAlgSHA256, ObjectAttributes: attrs, AuthPolicy: tpm2.TPM2BDigest{Buffer: authPolicy},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
			Symmetric: tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull},
			Scheme:    tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgECDSA, Details: tpm2.NewTPMUAsymScheme(tpm2.TPMAlgECDSA, &tpm2.TPMSSigSchemeECDSA{HashAlg: tpm2.TPMAlgSHA256})},
			CurveID:   tpm2.TPMECCNistP256, KDF: tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{X: tpm2.TPM2BECCParameter{Buffer: point[1:33]}, Y: tpm2.TPM2BECCParameter{Buffer: point[33:]}}),
	}, nil
}
