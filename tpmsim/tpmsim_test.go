package tpmsim

import (
	"fmt"
	"testing"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
)

// recTB records failures instead of failing the real test.
type recTB struct {
	testing.TB
	failed []string
}

func (r *recTB) Helper()                      {}
func (r *recTB) Errorf(f string, args ...any) { r.failed = append(r.failed, fmt.Sprintf(f, args...)) }
func (r *recTB) Fatalf(f string, args ...any) { r.Errorf(f, args...) }

func leakOne(t *testing.T, tp transport.TPM, kind string) (flush func()) {
	t.Helper()
	switch kind {
	case "transient":
		rsp, err := tpm2.CreatePrimary{
			PrimaryHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
			InPublic:      tpm2.New2B(tpm2.ECCSRKTemplate),
		}.Execute(tp)
		if err != nil {
			t.Fatal(err)
		}
		return func() { tpm2.FlushContext{FlushHandle: rsp.ObjectHandle}.Execute(tp) }
	case "session":
		_, closer, err := tpm2.PolicySession(tp, tpm2.TPMAlgSHA256, 16)
		if err != nil {
			t.Fatal(err)
		}
		return func() { closer() }
	}
	t.Fatalf("unknown kind %s", kind)
	return nil
}

func testLeakDetection(t *testing.T, tp transport.TPM) {
	for _, kind := range []string{"transient", "session"} {
		t.Run(kind, func(t *testing.T) {
			clean := &recTB{TB: t}
			CheckNoLeaks(clean, tp)
			if len(clean.failed) != 0 {
				t.Fatalf("clean TPM reported leaks: %v", clean.failed)
			}
			flush := leakOne(t, tp, kind)
			leaky := &recTB{TB: t}
			CheckNoLeaks(leaky, tp)
			flush()
			if len(leaky.failed) != 1 {
				t.Fatalf("a leaked %s handle was not reported: %v", kind, leaky.failed)
			}
			t.Logf("reported: %s", leaky.failed[0])
		})
	}
}

func TestLeakDetectionSimulator(t *testing.T) {
	sim := NewSimulator(t)
	testLeakDetection(t, sim.TPM())
}

func TestLeakDetectionSwtpm(t *testing.T) {
	sw := StartSwtpm(t, SwtpmOptions{})
	c, err := sw.dialRelay()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testLeakDetection(t, c)
}

// TestSwtpmRelay checks what tests rely on: several clients at once, PCR
// extension, state kept across a restart, connections closed by Kill.
func TestSwtpmRelay(t *testing.T) {
	sw := StartSwtpm(t, SwtpmOptions{})
	a, err := sw.dialRelay()
	if err != nil {
		t.Fatal(err)
	}
	b, err := sw.dialRelay()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []transport.TPM{a, b, a} {
		if _, err := (tpm2.GetRandom{BytesRequested: 8}).Execute(c); err != nil {
			t.Fatal(err)
		}
	}
	read := func(c transport.TPM) []byte {
		rsp, err := tpm2.PCRRead{PCRSelectionIn: tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{{
			Hash: tpm2.TPMAlgSHA256, PCRSelect: tpm2.PCClientCompatible.PCRs(16)}}}}.Execute(c)
		if err != nil {
			t.Fatal(err)
		}
		return rsp.PCRValues.Digests[0].Buffer
	}
	before := read(a)
	sw.ExtendPCR(t, 16, []byte("x"))
	if string(read(b)) == string(before) {
		t.Fatal("ExtendPCR did not change PCR 16")
	}
	sw.Kill()
	if _, err := (tpm2.GetRandom{BytesRequested: 8}).Execute(a); err == nil {
		t.Fatal("a connection survived Kill")
	}
	a.Close()
	b.Close()
	sw.Restart(t)
	c, err := sw.dialRelay()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if string(read(c)) != string(before) {
		t.Fatal("PCR 16 was not reset by the restart (startup-clear)")
	}
}
