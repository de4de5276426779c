package tpmpolicy

import (
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/google/go-tpm/tpm2"
)

// A key under policy authorities names a policyRef in each
// PolicyAuthorize of its policy, and the TPM checks an approval's ticket
// against SHA-256(approved policy || policyRef) (TPM 2.0 Part 3 §23.16):
// an approval signed for another ref cannot satisfy the key, whatever the
// software on the node does. The ref is how a key binds its approvals:
//
//   - v1 (PolicyRef, keys made before the PCR selection was bound): the ref
//     names only the purpose; an approval over any PCR selection satisfies
//     the key at the TPM. Still opened; status warns and points at rotate.
//   - v2 (policyRefV2Prefix + the selection as a 24-bit mask in hex, bit n =
//     PCR n): the ref names the key's PCR selection too, so an approval the
//     authority made for another selection (e.g. 7,16) is refused by the
//     TPM. The ref is at most 30 bytes: TPM2B_NONCE holds at most the
//     largest implemented digest, 32 bytes on a SHA-256-only TPM.
//   - systemd (empty ref, selection PCR 11): what systemd-measure signs, so
//     that its tpm2-pcr-signature.json approves the key. An empty ref binds
//     nothing: the selection is checked in software only, and the TPM
//     accepts any PolicyPCR the authority ever signed (see README).

// policyRefV2Prefix starts a v2 policyRef; the PCR mask follows.
const policyRefV2Prefix = "steward-trustd/os-ca/v2:"

// SystemdPCR is the one PCR a systemd-compatible key accepts approvals
// for: systemd-measure signs PolicyPCR(11) only (the UKI's PCR).
const SystemdPCR = 11

// bindingMode says how a key under policy authorities binds approvals.
type bindingMode int

const (
	modeInvalid bindingMode = iota
	modeV1
	modeV2
	modeSystemd
	modeRevocable
)

// Binding is what an approval of a key under policy authorities must
// carry to satisfy it: the policyRef of the key's PolicyAuthorize and, for
// v2 and systemd keys, the one PCR selection it accepts. The zero Binding
// is invalid (it binds nothing and is refused): make one with
// BindingForPCRs or SystemdBinding (or read it from a key blob: ParseKeyBlob).
type Binding struct {
	mode bindingMode
	ref  string
	pcrs []int
	nv   tpm2.TPMHandle // the revocation counter's NV index (revocable keys)
}

// BindingForPCRs is the v2 binding of a new key to the PCR selection pcrs
// (refused like ParsePCRs refuses it).
func BindingForPCRs(pcrs []int) (Binding, error) {
	sel, err := ParsePCRs(PCRList(pcrs))
	if err != nil || !slices.Equal(sel, pcrs) {
		return Binding{}, fmt.Errorf("PCR selection %v: %w", pcrs, orSelectionErr(err))
	}
	var mask uint32
	for _, p := range pcrs {
		mask |= 1 << p
	}
	return Binding{mode: modeV2, ref: fmt.Sprintf("%s%06x", policyRefV2Prefix, mask), pcrs: slices.Clone(pcrs)}, nil
}

// SystemdBinding is the binding of a systemd-compatible key: empty ref,
// PCR 11.
func SystemdBinding() Binding {
	return Binding{mode: modeSystemd, pcrs: []int{SystemdPCR}}
}

// LegacyBinding is the binding of a v1 key: PolicyRef, any selection.
func LegacyBinding() Binding { return Binding{mode: modeV1, ref: PolicyRef} }

func orSelectionErr(err error) error {
	if err != nil {
		return err
	}
	return invalid("want distinct ascending sha256 PCRs 0-%d", MaxPCR)
}

// bindingOfRef decodes the binding a key's policyRef names.
func bindingOfRef(ref string) (Binding, error) {
	switch ref {
	case PolicyRef:
		return LegacyBinding(), nil
	case "":
		return SystemdBinding(), nil
	}
	if strings.HasPrefix(ref, policyRefRevocablePrefix) {
		return revocableBindingOfRef(ref)
	}
	mask, ok := strings.CutPrefix(ref, policyRefV2Prefix)
	raw, err := hex.DecodeString(mask)
	if !ok || err != nil || len(raw) != 3 || hex.EncodeToString(raw) != mask {
		return Binding{}, fmt.Errorf("policyRef %q is not one this backend makes (%q, %q + 6 hex digits, or empty)", ref, PolicyRef, policyRefV2Prefix)
	}
	var pcrs []int
	for p := range MaxPCR + 1 {
		if raw[2-p/8]&(1<<(p%8)) != 0 {
			pcrs = append(pcrs, p)
		}
	}
	b, err := BindingForPCRs(pcrs)
	if err != nil {
		return Binding{}, fmt.Errorf("policyRef %q: %w", ref, err)
	}
	return b, nil
}

// Ref is the policyRef the key's PolicyAuthorize names.
func (b Binding) Ref() string { return b.ref }

// PCRs is the one PCR selection the key accepts approvals for; nil for a
// v1 key, which accepts any.
func (b Binding) PCRs() []int { return slices.Clone(b.pcrs) }

// Mode names the binding: "v2" (selection bound in the TPM), "systemd"
// (empty ref, selection checked in software) or "v1" (not bound).
func (b Binding) Mode() string {
	switch b.mode {
	case modeV1:
		return "v1"
	case modeV2:
		return "v2"
	case modeSystemd:
		return "systemd"
	case modeRevocable:
		return "r1"
	}
	return "invalid"
}

// Systemd reports whether the key is systemd-compatible (empty ref).
func (b Binding) Systemd() bool { return b.mode == modeSystemd }

// Weakness says, for a key whose policy lets an approval over another
// PCR selection satisfy it at the TPM, what that means and what to do;
// empty for a v2 key.
func (b Binding) Weakness() string {
	switch b.mode {
	case modeV1:
		return "this key's policy (policyRef " + PolicyRef + ") does not bind its PCR selection: the TPM accepts an approval over any selection its authority signed, including software-resettable PCRs; create a new key (steward-trustd-ceremony rotate --new-signer 'tpm:path=NEW;approvals=DIR' --policy-authority AUTH) whose policy binds the selection"
	case modeSystemd:
		return "systemd-compatible key (empty policyRef): the PCR selection (11) is checked in software only; the TPM accepts any PolicyPCR its authority signed"
	}
	return ""
}

// check refuses an approval over pcrs that the binding does not accept.
func (b Binding) check(pcrs []int) error {
	if b.mode == modeInvalid {
		return fmt.Errorf("no key binding: name the key whose approvals these are")
	}
	if _, err := ParsePCRs(PCRList(pcrs)); err != nil {
		return err
	}
	if b.pcrs != nil && !slices.Equal(pcrs, b.pcrs) {
		return fmt.Errorf("PCR selection sha256:%s is not the key's sha256:%s (fixed at creation and bound in its policy, policyRef %q); approve the key's own selection", PCRList(pcrs), PCRList(b.pcrs), b.ref)
	}
	return nil
}

// String describes the binding for messages.
func (b Binding) String() string {
	if b.pcrs == nil {
		return fmt.Sprintf("%s (policyRef %q, selection not bound)", b.Mode(), b.ref)
	}
	if b.Revocable() {
		return fmt.Sprintf("%s (policyRef %q, PCR selection sha256:%s, revocation counter NV 0x%08x)", b.Mode(), b.ref, PCRList(b.pcrs), uint32(b.nv))
	}
	return fmt.Sprintf("%s (policyRef %q, PCR selection sha256:%s)", b.Mode(), b.ref, PCRList(b.pcrs))
}
