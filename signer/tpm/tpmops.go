package tpm

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// srkTemplate is the TCG EK Credential Profile template H-2 (ECC NIST P-256,
// AES-128-CFB, empty unique) in the owner hierarchy: the parent that the
// TPM 2.0 Key Files spec assigns to keys whose parent is TPM_RH_OWNER, so
// that openssl_tpm2_engine and the tpm2 OpenSSL provider load our blobs.
// The SRK is recreated with TPM2_CreatePrimary whenever it is needed (it is
// derived from the owner seed, so it is the same key every time) and
// flushed at once; nothing is made persistent.
func srkTemplate() tpm2.TPMTPublic {
	return tpm2.TPMTPublic{
		Type:    tpm2.TPMAlgECC,
		NameAlg: tpm2.TPMAlgSHA256,
		ObjectAttributes: tpm2.TPMAObject{
			FixedTPM:            true,
			FixedParent:         true,
			SensitiveDataOrigin: true,
			UserWithAuth:        true,
			NoDA:                true,
			Restricted:          true,
			Decrypt:             true,
		},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
			Symmetric: tpm2.TPMTSymDefObject{
				Algorithm: tpm2.TPMAlgAES,
				KeyBits:   tpm2.NewTPMUSymKeyBits(tpm2.TPMAlgAES, tpm2.TPMKeyBits(128)),
				Mode:      tpm2.NewTPMUSymMode(tpm2.TPMAlgAES, tpm2.TPMAlgCFB),
			},
			CurveID: tpm2.TPMECCNistP256,
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
			X: tpm2.TPM2BECCParameter{Buffer: []byte{}},
			Y: tpm2.TPM2BECCParameter{Buffer: []byte{}},
		}),
	}
}

// srk is a loaded storage root key.
type srk struct {
	handle tpm2.TPMHandle
	name   tpm2.TPM2BName
	public tpm2.TPMTPublic
}

func createSRK(t transport.TPM) (*srk, error) {
	rsp, err := tpm2.CreatePrimary{
		PrimaryHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
		InPublic:      tpm2.New2B(srkTemplate()),
	}.Execute(t)
	if err != nil {
		return nil, fmt.Errorf("create SRK (TPM2_CreatePrimary, owner hierarchy): %w", err)
	}
	pub, err := rsp.OutPublic.Contents()
	if err != nil {
		flush(t, rsp.ObjectHandle)
		return nil, fmt.Errorf("create SRK: %w", err)
	}
	return &srk{handle: rsp.ObjectHandle, name: rsp.Name, public: *pub}, nil
}

func (s *srk) auth() tpm2.AuthHandle {
	return tpm2.AuthHandle{Handle: s.handle, Name: s.name, Auth: tpm2.PasswordAuth(nil)}
}

// flush releases a transient object or session. Its error is not reported:
// it runs on cleanup paths, and a dead transport is detected by the next
// command anyway.
func flush(t transport.TPM, h tpm2.TPMHandle) {
	_, _ = tpm2.FlushContext{FlushHandle: h}.Execute(t)
}

// loadBlob loads a key blob under the SRK and returns its transient handle;
// the SRK is flushed before returning so only the key stays loaded.
func loadBlob(t transport.TPM, b *tpmpolicy.KeyBlob) (tpm2.TPMHandle, tpm2.TPM2BName, error) {
	parent, err := createSRK(t)
	if err != nil {
		return 0, tpm2.TPM2BName{}, err
	}
	defer flush(t, parent.handle)
	rsp, err := tpm2.Load{
		ParentHandle: parent.auth(),
		InPrivate:    b.Private,
		InPublic:     b.Public,
	}.Execute(t)
	if err != nil {
		return 0, tpm2.TPM2BName{}, fmt.Errorf("load key blob (TPM2_Load): %w", err)
	}
	return rsp.ObjectHandle, rsp.Name, nil
}

// ReadPCRs reads the sha256 bank values of pcrs, in order.
func ReadPCRs(t transport.TPM, pcrs []int) ([][]byte, error) {
	out := make([][]byte, 0, len(pcrs))
	for _, p := range pcrs {
		rsp, err := tpm2.PCRRead{PCRSelectionIn: tpmpolicy.PCRSelection([]int{p})}.Execute(t)
		if err != nil {
			return nil, fmt.Errorf("read PCR %d (TPM2_PCR_Read): %w", p, err)
		}
		if len(rsp.PCRValues.Digests) != 1 || len(rsp.PCRValues.Digests[0].Buffer) != sha256.Size {
			return nil, fmt.Errorf("read PCR %d: the TPM has no allocated sha256 value for it", p)
		}
		out = append(out, rsp.PCRValues.Digests[0].Buffer)
	}
	return out, nil
}

// curveSupported asks the TPM whether it implements curve.
func curveSupported(t transport.TPM, curve tpm2.TPMECCCurve) (bool, error) {
	rsp, err := tpm2.GetCapability{Capability: tpm2.TPMCapECCCurves, Property: 0, PropertyCount: 64}.Execute(t)
	if err != nil {
		return false, fmt.Errorf("list ECC curves (TPM2_GetCapability): %w", err)
	}
	curves, err := rsp.CapabilityData.Data.ECCCurves()
	if err != nil {
		return false, err
	}
	for _, c := range curves.ECCCurves {
		if c == curve {
			return true, nil
		}
	}
	return false, nil
}

// handleInUse reports whether a persistent handle holds an object.
func handleInUse(t transport.TPM, h tpm2.TPMHandle) (bool, error) {
	rsp, err := tpm2.GetCapability{Capability: tpm2.TPMCapHandles, Property: uint32(h), PropertyCount: 1}.Execute(t)
	if err != nil {
		return false, fmt.Errorf("list persistent handles (TPM2_GetCapability): %w", err)
	}
	hs, err := rsp.CapabilityData.Data.Handles()
	if err != nil {
		return false, err
	}
	return len(hs.Handle) > 0 && hs.Handle[0] == h, nil
}

// LoadedHandles lists the transient objects and the loaded or saved
// sessions the TPM holds (TPM2_GetCapability(TPM_CAP_HANDLES), TPM 2.0
// Part 3 §30.2: TPM_HT_LOADED_SESSION lists loaded HMAC and policy
// sessions, TPM_HT_SAVED_SESSION the context-saved ones, either handle
// type); tests use it to find leaked handles.
func LoadedHandles(t transport.TPM) ([]tpm2.TPMHandle, error) {
	var out []tpm2.TPMHandle
	seen := map[tpm2.TPMHandle]bool{}
	for _, ht := range []tpm2.TPMHT{tpm2.TPMHTTransient, tpm2.TPMHTHMACSession, tpm2.TPMHTPolicySession} {
		want := func(h tpm2.TPMHandle) bool {
			typ := tpm2.TPMHT(uint32(h) >> 24)
			if ht == tpm2.TPMHTTransient {
				return typ == tpm2.TPMHTTransient
			}
			return typ == tpm2.TPMHTHMACSession || typ == tpm2.TPMHTPolicySession
		}
		first := uint32(ht) << 24
		for {
			rsp, err := tpm2.GetCapability{Capability: tpm2.TPMCapHandles, Property: first, PropertyCount: 64}.Execute(t)
			if err != nil {
				return nil, fmt.Errorf("list handles (TPM2_GetCapability): %w", err)
			}
			hs, err := rsp.CapabilityData.Data.Handles()
			if err != nil {
				return nil, err
			}
			var last tpm2.TPMHandle
			n := 0
			for _, h := range hs.Handle {
				if !want(h) {
					continue
				}
				n++
				last = h
				if !seen[h] {
					seen[h] = true
					out = append(out, h)
				}
			}
			if !rsp.MoreData || n == 0 || uint32(last) < first {
				break
			}
			first = uint32(last) + 1
		}
	}
	return out, nil
}

// reclaimStale frees the object and session slots that clients which died
// without flushing left in a TPM that has no resource manager, and reports
// whether anything was freed so that the caller retries once. swtpm's
// socket and /dev/tpm0 serve one client at a time and keep transient
// objects across connections: a daemon killed while holding its key would
// otherwise leave swtpm's three object slots full
// (TPM_RC_OBJECT_MEMORY, TPM 2.0 Part 2 §6.6.3) for every later client.
// Behind /dev/tpmrm0 the kernel flushes a closed client's handles, so
// nothing is touched there.
func reclaimStale(t transport.TPM, dev Device, cause error, log *slog.Logger) bool {
	if !errors.Is(cause, tpm2.TPMRCObjectMemory) && !errors.Is(cause, tpm2.TPMRCSessionMemory) {
		return false
	}
	if !dev.singleClient() {
		return false
	}
	hs, err := LoadedHandles(t)
	if err != nil || len(hs) == 0 {
		return false
	}
	for _, h := range hs {
		flush(t, h)
	}
	log.Warn("tpm: flushed handles left by a client that did not clean up (no resource manager on this device)",
		"device", dev.String(), "handles", len(hs))
	return true
}
