package relay_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// TestClientsIsolated: sharing the TPM must not break the daemon. One
// client (attest
// --challenge, tpm2_flushcontext -t, the signer's reclaim) flushing
// "every loaded handle" or a specific handle of another client — the
// daemon's key and session — must not touch them: it sees none of them,
// and a flush or use of them is refused with TPM_RC_HANDLE; the owner
// keeps signing.
func TestClientsIsolated(t *testing.T) {
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	daemon, other := dialSwtpm(t, sw), dialSwtpm(t, sw)
	key := signingKey(t, daemon)
	sess, err := tpm2.StartAuthSession{TPMKey: tpm2.TPMRHNull, Bind: tpm2.TPMRHNull, SessionType: tpm2.TPMSEPolicy, Symmetric: tpm2.TPMTSymDef{Algorithm: tpm2.TPMAlgNull}, AuthHash: tpm2.TPMAlgSHA256, NonceCaller: tpm2.TPM2BNonce{Buffer: make([]byte, 16)}}.Execute(daemon)
	if err != nil {
		t.Fatal(err)
	}
	if hs, err := tpm.LoadedHandles(other); err != nil || len(hs) != 0 {
		t.Fatalf("another client lists %v, %v; want none of the daemon's handles", hs, err)
	}
	for _, h := range []tpm2.TPMHandle{key.ObjectHandle, sess.SessionHandle} {
		if _, err := (tpm2.FlushContext{FlushHandle: h}).Execute(other); !errors.Is(err, tpm2.TPMRCHandle) {
			t.Errorf("another client flushed 0x%08x: %v, want TPM_RC_HANDLE", uint32(h), err)
		}
	}
	if _, err := sign(other, key); !errors.Is(err, tpm2.TPMRCHandle) {
		t.Errorf("another client signed with the daemon's key: %v, want TPM_RC_HANDLE", err)
	}
	if _, err := sign(daemon, key); err != nil {
		t.Fatalf("the daemon's key stopped working: %v", err)
	}
	if hs, err := tpm.LoadedHandles(daemon); err != nil || len(hs) != 2 {
		t.Fatalf("the daemon lists %v, %v; want its key and session", hs, err)
	}
	for _, h := range []tpm2.TPMHandle{key.ObjectHandle, sess.SessionHandle} {
		if _, err := (tpm2.FlushContext{FlushHandle: h}).Execute(daemon); err != nil {
			t.Fatalf("the owner's flush of 0x%08x: %v", uint32(h), err)
		}
	}
	sw.CheckNoLeaks(t)
}

func dialSwtpm(t *testing.T, sw *tpmsim.Swtpm) transport.TPMCloser {
	t.Helper()
	c, err := sw.Dial(context.Background(), sw.Device())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// signingKey loads an unrestricted ECDSA P-256 primary signing key.
func signingKey(t *testing.T, c transport.TPM) *tpm2.CreatePrimaryResponse {
	t.Helper()
	rsp, err := tpm2.CreatePrimary{
		PrimaryHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
		InPublic: tpm2.New2B(tpm2.TPMTPublic{
			Type: tpm2.TPMAlgECC, NameAlg: tpm2.TPMAlgSHA256,
			ObjectAttributes: tpm2.TPMAObject{FixedTPM: true, FixedParent: true, SensitiveDataOrigin: true, UserWithAuth: true, SignEncrypt: true},
			Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
				Scheme:  tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgECDSA, Details: tpm2.NewTPMUAsymScheme(tpm2.TPMAlgECDSA, &tpm2.TPMSSigSchemeECDSA{HashAlg: tpm2.TPMAlgSHA256})},
				CurveID: tpm2.TPMECCNistP256,
			}),
		}),
	}.Execute(c)
	if err != nil {
		t.Fatal(err)
	}
	return rsp
}

// sign signs with key, retrying TPM_RC_RETRY (swtpm's first use of an
// algorithm runs its self-test; Part 1 §12.3).
func sign(c transport.TPM, key *tpm2.CreatePrimaryResponse) (*tpm2.SignResponse, error) {
	digest := sha256.Sum256([]byte("worker CSR"))
	for i := 0; ; i++ {
		rsp, err := tpm2.Sign{
			KeyHandle:  tpm2.AuthHandle{Handle: key.ObjectHandle, Name: key.Name, Auth: tpm2.PasswordAuth(nil)},
			Digest:     tpm2.TPM2BDigest{Buffer: digest[:]},
			Validation: tpm2.TPMTTKHashCheck{Tag: tpm2.TPMSTHashCheck, Hierarchy: tpm2.TPMRHNull},
		}.Execute(c)
		if !errors.Is(err, tpm2.TPMRCRetry) || i == 5 {
			return rsp, err
		}
	}
}

// TestObjectsSwappedOut: swtpm holds three transient objects. A client
// that needs all three while another client holds a key gets them (the
// relay swaps the other's key out), and the owner's key signs again
// afterwards under the handle it was given (swapped back in), whatever
// number the TPM now uses for it.
func TestObjectsSwappedOut(t *testing.T) {
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	daemon, other := dialSwtpm(t, sw), dialSwtpm(t, sw)
	key := signingKey(t, daemon)
	var others []*tpm2.CreatePrimaryResponse
	for range 3 {
		others = append(others, signingKey(t, other))
	}
	if _, err := sign(daemon, key); err != nil {
		t.Fatalf("the daemon's key after another client filled the TPM: %v", err)
	}
	for _, k := range others {
		if _, err := sign(other, k); err != nil {
			t.Fatalf("the other client's key 0x%08x: %v", uint32(k.ObjectHandle), err)
		}
	}
	if _, err := sign(daemon, key); err != nil {
		t.Fatalf("the daemon's key, swapped back once more: %v", err)
	}
	for _, k := range others {
		if _, err := (tpm2.FlushContext{FlushHandle: k.ObjectHandle}).Execute(other); err != nil {
			t.Fatalf("flush 0x%08x (loaded or swapped out): %v", uint32(k.ObjectHandle), err)
		}
	}
	if _, err := (tpm2.FlushContext{FlushHandle: key.ObjectHandle}).Execute(daemon); err != nil {
		t.Fatal(err)
	}
	sw.CheckNoLeaks(t)
}
