package tpmpolicy

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/google/go-tpm/tpm2"
)

// A revocable key (binding "r1") is a v2 key whose approvals can be
// withdrawn. Its TPM holds an NV counter in the owner hierarchy, and
// every approval of the key signs, after PolicyPCR, a TPM2_PolicyNV
// (TPM 2.0 Part 3 §23.9) that requires counter <= the approval's epoch
// (TPM_EO_UNSIGNED_LE at offset 0, as canonical/secboot does). Advancing
// the counter past an epoch (policy revoke) makes every approval of an
// older epoch fail at the TPM; the counter never goes back, not even by
// deleting and re-creating the index (TPM 2.0 Part 1, NV counter indices:
// a counter is initialised at its first increment to the largest value
// any counter on the TPM had; tested on swtpm). PolicyNV names the index
// by its Name, so an approval is bound to this counter; the ref names the
// index and the selection, so that the key blob records both and an
// approval without PolicyNV (a v2 one of the same authority) does not fit.
//
// Why PolicyNV and not PolicyAuthorizeNV: PolicyAuthorizeNV keeps ONE
// approved policy in NV (systemd-pcrlock's model): withdrawing is
// replacing it, but then a fleet can never have two live states at once
// (old and new firmware during a rollout), and every approval needs an NV
// write on every node. An epoch inside each signed approval keeps
// approvals as files that are copied (a ConfigMap), several live at once,
// and one counter increment on a node withdraws all older ones.

// policyRefRevocablePrefix starts an r1 policyRef; the PCR mask, ":" and
// the low 24 bits of the NV index follow (31 bytes, within the 32 of a
// SHA-256-only TPM's TPM2B_NONCE).
const policyRefRevocablePrefix = "steward-trustd/r1:"

// DefaultRevocationIndex is the NV index of the revocation counter when
// the ceremony is not given one (owner range, "ST" in the low bytes).
const DefaultRevocationIndex tpm2.TPMHandle = 0x01005354

// Owner-defined NV indices this backend accepts for the counter: the
// NV handle range below the TCG's reserved ranges (EK and platform
// certificates start at 0x01C00000).
const (
	minRevocationIndex tpm2.TPMHandle = 0x01000000
	maxRevocationIndex tpm2.TPMHandle = 0x01BFFFFF
)

// MaxRevokeStep bounds how far one policy revoke advances the counter:
// each step is one TPM2_NV_Increment (NV writes wear, and a typo such as
// --before 1000000 must not run for hours).
const MaxRevokeStep = 1024

// CheckRevocationIndex refuses an NV index outside the owner range this
// backend uses for the revocation counter.
func CheckRevocationIndex(h tpm2.TPMHandle) error {
	if h < minRevocationIndex || h > maxRevocationIndex {
		return fmt.Errorf("NV index 0x%08x: the revocation counter needs an owner NV index 0x%08x-0x%08x (default 0x%08x)", uint32(h), uint32(minRevocationIndex), uint32(maxRevocationIndex), uint32(DefaultRevocationIndex))
	}
	return nil
}

// RevocableBinding is the binding of a new revocable key to the PCR
// selection pcrs and the NV counter at index.
func RevocableBinding(pcrs []int, index tpm2.TPMHandle) (Binding, error) {
	if err := CheckRevocationIndex(index); err != nil {
		return Binding{}, err
	}
	b, err := BindingForPCRs(pcrs)
	if err != nil {
		return Binding{}, err
	}
	mask := strings.TrimPrefix(b.ref, policyRefV2Prefix)
	return Binding{mode: modeRevocable, ref: fmt.Sprintf("%s%s:%06x", policyRefRevocablePrefix, mask, uint32(index)&0xFFFFFF), pcrs: b.pcrs, nv: index}, nil
}

// revocableBindingOfRef decodes an r1 policyRef.
func revocableBindingOfRef(ref string) (Binding, error) {
	rest, _ := strings.CutPrefix(ref, policyRefRevocablePrefix)
	mask, idx, ok := strings.Cut(rest, ":")
	raw, err := hex.DecodeString(idx)
	if !ok || err != nil || len(raw) != 3 || hex.EncodeToString(raw) != idx {
		return Binding{}, fmt.Errorf("policyRef %q: want %sMASK:INDEX (6 hex digits each)", ref, policyRefRevocablePrefix)
	}
	v2, err := bindingOfRef(policyRefV2Prefix + mask)
	if err != nil {
		return Binding{}, fmt.Errorf("policyRef %q: %w", ref, err)
	}
	index := tpm2.TPMHandle(0x01000000 | uint32(raw[0])<<16 | uint32(raw[1])<<8 | uint32(raw[2]))
	b, err := RevocableBinding(v2.pcrs, index)
	if err != nil || b.ref != ref {
		return Binding{}, fmt.Errorf("policyRef %q is not one this backend makes: %w", ref, orSelectionErr(err))
	}
	return b, nil
}

// Revocable reports whether the key's approvals carry an epoch checked
// against its NV counter.
func (b Binding) Revocable() bool { return b.mode == modeRevocable }

// RevocationIndex is the NV index of a revocable key's counter (0 for
// any other key).
func (b Binding) RevocationIndex() tpm2.TPMHandle { return b.nv }

// RevocationCounterPublic is the public area of the revocation counter at
// index, as written (TPMA_NV_WRITTEN set, as its Name is once it has a
// value): an NV counter, incremented with owner authorization only
// (OWNERWRITE), read by anyone who can talk to the TPM with its empty
// auth value (AUTHREAD: PolicyNV needs that), never locked out (NO_DA).
// written=false gives the area to pass to TPM2_NV_DefineSpace.
func RevocationCounterPublic(index tpm2.TPMHandle, written bool) tpm2.TPMSNVPublic {
	return tpm2.TPMSNVPublic{
		NVIndex: index,
		NameAlg: tpm2.TPMAlgSHA256,
		Attributes: tpm2.TPMANV{
			NT: tpm2.TPMNTCounter, OwnerWrite: true, AuthRead: true, OwnerRead: true,
			NoDA: true, Written: written,
		},
		DataSize: 8,
	}
}

// RevocationCounterName is the TPM Name of the written counter at index:
// what every approval's PolicyNV binds.
func RevocationCounterName(index tpm2.TPMHandle) (tpm2.TPM2BName, error) {
	pub := RevocationCounterPublic(index, true)
	n, err := tpm2.NVName(&pub)
	if err != nil {
		return tpm2.TPM2BName{}, fmt.Errorf("revocation counter name: %w", err)
	}
	return *n, nil
}

// EpochOperand is PolicyNV's operandB for epoch: the counter's 8 bytes,
// big-endian (an NV counter is a UINT64, Part 2 §13.4).
func EpochOperand(epoch uint64) tpm2.TPM2BOperand {
	return tpm2.TPM2BOperand{Buffer: binary.BigEndian.AppendUint64(nil, epoch)}
}

// EpochPolicy is PolicyNV(counter at index <= epoch) as the session runs it.
func EpochPolicy(sess tpm2.TPMHandle, index tpm2.TPMHandle, name tpm2.TPM2BName, epoch uint64) tpm2.PolicyNV {
	nv := tpm2.NamedHandle{Handle: index, Name: name}
	return tpm2.PolicyNV{AuthHandle: nv, NVIndex: nv, PolicySession: sess, OperandB: EpochOperand(epoch), Offset: 0, Operation: tpm2.TPMEOUnsignedLE}
}

// EpochPolicyDigest extends pcrPol, a PolicyPCR session digest, with
// PolicyNV(counter <= epoch) of the key's counter: the "pol" an approval
// of a revocable key signs. Part 3 §23.9:
// policyDigest' = H(policyDigest || TPM_CC_PolicyNV || args || nvIndex->Name),
// args = H(operandB || offset || operation). (go-tpm's PolicyCalculator
// starts only from the zero digest, hence by hand; a test checks both
// agree from zero, and the swtpm tests that the TPM agrees.)
func EpochPolicyDigest(pcrPol []byte, b Binding, epoch uint64) ([]byte, error) {
	if !b.Revocable() {
		return nil, errors.New("epoch policy: the key is not revocable")
	}
	if len(pcrPol) != sha256.Size {
		return nil, fmt.Errorf("epoch policy: a policy digest of %d bytes, want %d", len(pcrPol), sha256.Size)
	}
	name, err := RevocationCounterName(b.nv)
	if err != nil {
		return nil, err
	}
	args := sha256.New()
	args.Write(EpochOperand(epoch).Buffer)
	args.Write([]byte{0, 0}) // offset 0
	args.Write(binary.BigEndian.AppendUint16(nil, uint16(tpm2.TPMEOUnsignedLE)))
	h := sha256.New()
	h.Write(pcrPol)
	h.Write(binary.BigEndian.AppendUint32(nil, uint32(tpm2.TPMCCPolicyNV)))
	h.Write(args.Sum(nil))
	h.Write(name.Buffer)
	return h.Sum(nil), nil
}
