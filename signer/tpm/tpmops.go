package tpm

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
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
func loadBlob(t transport.TPM, b *keyBlob) (tpm2.TPMHandle, tpm2.TPM2BName, error) {
	parent, err := createSRK(t)
	if err != nil {
		return 0, tpm2.TPM2BName{}, err
	}
	defer flush(t, parent.handle)
	rsp, err := tpm2.Load{
		ParentHandle: parent.auth(),
		InPrivate:    b.private,
		InPublic:     b.public,
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
		rsp, err := tpm2.PCRRead{PCRSelectionIn: pcrSelection([]int{p})}.Execute(t)
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

// pcrDigestOf is the PolicyPCR pcrDigest: SHA-256 over the selected PCR
// values concatenated in index order (TPM 2.0 Part 3 §23.7).
func pcrDigestOf(values [][]byte) []byte {
	h := sha256.New()
	for _, v := range values {
		h.Write(v)
	}
	return h.Sum(nil)
}

// computeAuthPolicy is the key's authPolicy: PolicyPCR(pcrs, pcrDigest)
// then PolicyCommandCode(TPM_CC_Sign), computed in software (Part 3 §23.7,
// §23.11).
func computeAuthPolicy(pcrs []int, pcrDigest []byte) ([]byte, error) {
	pc, err := tpm2.NewPolicyCalculator(tpm2.TPMAlgSHA256)
	if err != nil {
		return nil, err
	}
	if err := (tpm2.PolicyPCR{PcrDigest: tpm2.TPM2BDigest{Buffer: pcrDigest}, Pcrs: pcrSelection(pcrs)}).Update(pc); err != nil {
		return nil, fmt.Errorf("compute policy: %w", err)
	}
	if err := (tpm2.PolicyCommandCode{Code: tpm2.TPMCCSign}).Update(pc); err != nil {
		return nil, fmt.Errorf("compute policy: %w", err)
	}
	return pc.Hash().Digest, nil
}

// keyTemplate is the public area of a CA key. userWithAuth is clear so the
// empty auth value cannot bypass the policy, adminWithPolicy is set so the
// admin role (TPM2_ObjectChangeAuth, TPM2_Certify of the key) also needs
// the policy, which only ever allows TPM2_Sign. noDA is set because the
// key has no auth value to guess and a daemon retrying a refused policy
// must not lock the TPM out. The scheme is TPM_ALG_NULL so that each
// TPM2_Sign names its hash. Imported keys cannot be fixedTPM/fixedParent
// (Part 3 §13.3.1) and their sensitive data did not originate in the TPM.
func keyTemplate(curve tpm2.TPMECCCurve, authPolicy []byte, imported bool) tpm2.TPMTPublic {
	return tpm2.TPMTPublic{
		Type:    tpm2.TPMAlgECC,
		NameAlg: tpm2.TPMAlgSHA256,
		ObjectAttributes: tpm2.TPMAObject{
			FixedTPM:            !imported,
			FixedParent:         !imported,
			SensitiveDataOrigin: !imported,
			UserWithAuth:        false,
			AdminWithPolicy:     true,
			NoDA:                true,
			SignEncrypt:         true,
		},
		AuthPolicy: tpm2.TPM2BDigest{Buffer: authPolicy},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
			Symmetric: tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull},
			Scheme:    tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgNull},
			CurveID:   curve,
			KDF:       tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{}),
	}
}

// checkKeyPublic verifies that a public area found in a blob or at a handle
// is a key this backend would have made, and returns its public key.
func checkKeyPublic(p *tpm2.TPMTPublic) (*ecdsa.PublicKey, error) {
	if p.Type != tpm2.TPMAlgECC {
		return nil, fmt.Errorf("key type %v is not ECC", p.Type)
	}
	a := p.ObjectAttributes
	if !a.SignEncrypt || a.Decrypt || a.Restricted {
		return nil, errors.New("key is not an unrestricted signing key")
	}
	if a.UserWithAuth {
		return nil, errors.New("key has userWithAuth set: its empty auth value would bypass the PCR policy; re-create it with this backend")
	}
	if p.NameAlg != tpm2.TPMAlgSHA256 || len(p.AuthPolicy.Buffer) != sha256.Size {
		return nil, errors.New("key has no sha256 authPolicy")
	}
	ecc, err := p.Parameters.ECCDetail()
	if err != nil {
		return nil, err
	}
	if ecc.CurveID != tpm2.TPMECCNistP256 && ecc.CurveID != tpm2.TPMECCNistP384 {
		return nil, fmt.Errorf("key curve %v is not P-256 or P-384", ecc.CurveID)
	}
	pt, err := p.Unique.ECC()
	if err != nil {
		return nil, err
	}
	pub, err := tpm2.ECDSAPub(ecc, pt)
	if err != nil {
		return nil, fmt.Errorf("key public point: %w", err)
	}
	return pub, nil
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
