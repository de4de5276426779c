package tpm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// The revocation counter of a revocable key (tpmpolicy.RevocableBinding):
// an NV counter in the owner hierarchy whose value is the key's current
// epoch. Every approval of the key runs TPM2_PolicyNV(counter <= its
// epoch) before PolicyAuthorize, so advancing the counter withdraws every
// approval of an older epoch at the TPM.

// errRevoked marks an approval whose epoch is below the counter (internal).
var errRevoked = errors.New("approval revoked")

// parseRevocationIndex parses revocation=0x01xxxxxx.
func parseRevocationIndex(v string) (tpm2.TPMHandle, error) {
	digits, ok := strings.CutPrefix(v, "0x")
	n, err := strconv.ParseUint(digits, 16, 32)
	if !ok || len(digits) != 8 || err != nil {
		return 0, uriErr("revocation %q must be 0x followed by 8 hex digits, e.g. 0x%08x", v, uint32(tpmpolicy.DefaultRevocationIndex))
	}
	if err := tpmpolicy.CheckRevocationIndex(tpm2.TPMHandle(n)); err != nil {
		return 0, uriErr("revocation=: %v", err)
	}
	return tpm2.TPMHandle(n), nil
}

// revocation checks revocation=: it applies to a v2 key under a policy
// authority only (a systemd key's ref is systemd's, empty).
func (p *uriParser) revocation() error {
	switch {
	case p.u.Revocation == 0:
		return nil
	case p.u.Approvals == "":
		return uriErr("revocation= applies to a key under a policy authority; name its approvals directory (approvals=/dir)")
	case p.u.Systemd:
		return uriErr("revocation= and systemd=true exclude each other: systemd-measure signs no revocation epoch")
	}
	return nil
}

// revocableBinding is the r1 binding a URI with revocation= creates.
func revocableBinding(u KeyURI) tpmpolicy.Binding {
	b, err := tpmpolicy.RevocableBinding(u.PCRs, u.Revocation)
	if err != nil {
		return tpmpolicy.Binding{} // unreachable: ParseURI checked PCRs and index with the same rules
	}
	return b
}

// checkURIRevocation checks a URI's revocation= against the blob's binding.
func checkURIRevocation(u KeyURI, b tpmpolicy.Binding) error {
	if u.Revocation != 0 && u.Revocation != b.RevocationIndex() {
		return fmt.Errorf("tpm: key blob %s has policy %s but the URI says revocation=0x%08x: %w", u.Path, b, uint32(u.Revocation), signer.ErrInvalidURI)
	}
	return nil
}

// WithRevocation returns the tpm: key URI uri, about to be created under
// policy authorities, made revocable with its counter at NV index.
func WithRevocation(uri string, index tpm2.TPMHandle) (string, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return "", err
	}
	if u.Revocation != 0 {
		return "", uriErr("the URI already names revocation=")
	}
	out := fmt.Sprintf("%s;revocation=0x%08x", uri, uint32(index))
	if _, err := ParseURI(out); err != nil {
		return "", err
	}
	return out, nil
}

// ensureCounter makes sure a revocable key's counter exists and has a
// value (PolicyNV refuses an unwritten index): TPM2_NV_DefineSpace with
// owner authorization, then one TPM2_NV_Increment. An index already
// defined with exactly this public area is the counter of an interrupted
// creation (or of another key on this TPM using the same index): used as
// it is, never reset. Any other NV space there is refused.
func ensureCounter(t transport.TPM, b tpmpolicy.Binding) error {
	if !b.Revocable() {
		return nil
	}
	idx := b.RevocationIndex()
	pub, err := tpm2.NVReadPublic{NVIndex: idx}.Execute(t)
	switch {
	case err == nil:
		return adoptCounter(t, idx, pub)
	case !errors.Is(err, tpm2.TPMRCHandle):
		return fmt.Errorf("read NV index 0x%08x (TPM2_NV_ReadPublic): %w", uint32(idx), err)
	}
	_, err = tpm2.NVDefineSpace{
		AuthHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
		PublicInfo: tpm2.New2B(tpmpolicy.RevocationCounterPublic(idx, false)),
	}.Execute(t)
	if err != nil {
		return fmt.Errorf("define the revocation counter at NV index 0x%08x (TPM2_NV_DefineSpace; the owner hierarchy must have an empty password): %w", uint32(idx), err)
	}
	return incrementCounter(t, idx)
}

// adoptCounter accepts an existing NV space at idx only if it is the
// counter this backend defines, and gives it a value if it has none.
func adoptCounter(t transport.TPM, idx tpm2.TPMHandle, pub *tpm2.NVReadPublicResponse) error {
	got, err := pub.NVPublic.Contents()
	if err != nil {
		return fmt.Errorf("NV index 0x%08x: %w", uint32(idx), err)
	}
	written := got.Attributes.Written
	want := tpmpolicy.RevocationCounterPublic(idx, written)
	if got.NameAlg != want.NameAlg || got.Attributes != want.Attributes || got.DataSize != want.DataSize || len(got.AuthPolicy.Buffer) != 0 {
		return fmt.Errorf("NV index 0x%08x is taken by another NV space on this TPM (attributes 0x%08x): choose a free index with --revocation-index 0x01xxxxxx (list them: tpm2_getcap handles-nv-index): %w",
			uint32(idx), tpm2.Marshal(got.Attributes), signer.ErrKeyExists)
	}
	if written {
		return nil
	}
	return incrementCounter(t, idx)
}

// incrementCounter adds one to the counter (TPM2_NV_Increment, owner
// authorization: OWNERWRITE).
func incrementCounter(t transport.TPM, idx tpm2.TPMHandle) error {
	_, err := tpm2.NVIncrement{
		AuthHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
		NVIndex:    tpm2.NamedHandle{Handle: idx, Name: counterName(idx, false)},
	}.Execute(t)
	if err != nil {
		return fmt.Errorf("advance the revocation counter at NV index 0x%08x (TPM2_NV_Increment; the owner hierarchy must have an empty password): %w", uint32(idx), err)
	}
	return nil
}

// counterName is the counter's Name before (written=false) or after its
// first increment; go-tpm sends no name for a password session, so it is
// only informational there.
func counterName(idx tpm2.TPMHandle, written bool) tpm2.TPM2BName {
	pub := tpmpolicy.RevocationCounterPublic(idx, written)
	n, err := tpm2.NVName(&pub)
	if err != nil {
		return tpm2.TPM2BName{}
	}
	return *n
}

// readCounter reads the counter's value (TPM2_NV_Read authorized by the
// index's own empty auth value: AUTHREAD).
func readCounter(t transport.TPM, idx tpm2.TPMHandle) (uint64, error) {
	rsp, err := tpm2.NVRead{
		AuthHandle: tpm2.AuthHandle{Handle: idx, Name: counterName(idx, true), Auth: tpm2.PasswordAuth(nil)},
		NVIndex:    tpm2.NamedHandle{Handle: idx, Name: counterName(idx, true)},
		Size:       8,
	}.Execute(t)
	if err != nil {
		return 0, fmt.Errorf("read the revocation counter at NV index 0x%08x (TPM2_NV_Read): %w", uint32(idx), err)
	}
	if len(rsp.Data.Buffer) != 8 {
		return 0, fmt.Errorf("revocation counter at NV index 0x%08x: %d bytes, want 8", uint32(idx), len(rsp.Data.Buffer))
	}
	return binary.BigEndian.Uint64(rsp.Data.Buffer), nil
}

// policyEpoch runs PolicyNV(counter <= a.Epoch) for an approval of a
// revocable key (nothing for other keys). The TPM refuses it with
// TPM_RC_POLICY once the counter passed the epoch: errRevoked. A failed
// policy command leaves the session digest as it was.
func (s *Signer) policyEpoch(t transport.TPM, sess tpm2.TPMHandle, a *tpmpolicy.CheckedApproval) error {
	b := s.km.binding
	if !b.Revocable() {
		return nil
	}
	name, err := tpmpolicy.RevocationCounterName(b.RevocationIndex())
	if err != nil {
		return err
	}
	nv := tpmpolicy.EpochPolicy(sess, b.RevocationIndex(), name, a.Epoch)
	nv.AuthHandle = tpm2.AuthHandle{Handle: b.RevocationIndex(), Name: name, Auth: tpm2.PasswordAuth(nil)}
	_, err = nv.Execute(t)
	switch {
	case errors.Is(err, tpm2.TPMRCPolicy):
		return fmt.Errorf("%w: %w", errRevoked, err)
	case errors.Is(err, tpm2.TPMRCHandle) || errors.Is(err, tpm2.TPMRCNVUninitialized):
		return counterGoneErr(b.RevocationIndex(), err)
	case err != nil:
		return fmt.Errorf("TPM2_PolicyNV (revocation counter 0x%08x): %w", uint32(b.RevocationIndex()), err)
	}
	return nil
}

// errCounterGone marks a revocable key whose counter is not defined (or
// has no value) on its TPM: a policy failure, not a lost key, so the
// connection and the loaded key are kept (internal).
var errCounterGone = errors.New("the revocation counter is gone")

// counterGoneErr says that the key's counter was deleted (TPM2_PolicyNV
// names an undefined or unwritten index) and what brings the key back.
func counterGoneErr(idx tpm2.TPMHandle, rc error) error {
	return fmt.Errorf("tpm: the key's revocation counter (NV 0x%08x) is not defined on this TPM or has no value, so no approval can be checked and the key does not sign: "+
		"someone with owner authorization deleted it (TPM2_NV_UndefineSpace) or re-defined it without incrementing it — find out who; define it again as the ceremony did (an owner NV counter at 0x%08x, 8 bytes, ownerwrite|authread|ownerread|no_da, incremented once: the TPM starts it above every epoch it had), "+
		"then approve this state at the new epoch (policy approve --signer reads it): %w: %w: %w", uint32(idx), uint32(idx), errCounterGone, signer.ErrPolicyNotSatisfied, rc)
}

// revokedErr says that the approvals of this PCR state were revoked,
// with the exact command that approves it again at the current epoch.
func (s *Signer) revokedErr(t transport.TPM, dead *tpmpolicy.CheckedApproval) error {
	idx := s.km.binding.RevocationIndex()
	epoch, err := readCounter(t, idx)
	if err != nil {
		return fmt.Errorf("tpm: approval %s (epoch %d) was revoked: %w: %w", dead.File, dead.Epoch, err, signer.ErrPolicyNotSatisfied)
	}
	vals, err := ReadPCRs(t, s.km.pcrs)
	if err != nil {
		return fmt.Errorf("tpm: approval %s (epoch %d) was revoked (counter at %d): %w: %w", dead.File, dead.Epoch, epoch, err, signer.ErrPolicyNotSatisfied)
	}
	flags := make([]string, len(vals))
	for i, p := range s.km.pcrs {
		flags[i] = fmt.Sprintf("--pcr %d=%x", p, vals[i])
	}
	return fmt.Errorf("tpm: approval %s of this PCR state was revoked: it was written at epoch %d and the key's revocation counter (NV 0x%08x) is at %d, so the TPM refuses it (TPM2_PolicyNV); "+
		"if this state is still legitimate (not the boot chain the revocation was for), approve it again at the current epoch: steward-trustd-ceremony policy approve --authority AUTHORITY_URI %s --epoch %d %s --out %s/NAME.json: %w",
		dead.File, dead.Epoch, uint32(idx), epoch, s.keyArg(), epoch, strings.Join(flags, " "), s.uri.Approvals, signer.ErrPolicyNotSatisfied)
}

// RevocationEpoch reads the current epoch of a revocable key (its
// counter's value); an error for any other key.
func (s *Signer) RevocationEpoch(ctx context.Context) (uint64, error) {
	b := s.km.binding
	if !b.Revocable() {
		return 0, fmt.Errorf("tpm: the key's approvals are not revocable (policy %s); make a revocable key: steward-trustd-ceremony rotate --new-signer 'tpm:path=NEW;approvals=DIR' --policy-authority AUTH --revocable", b)
	}
	var epoch uint64
	err := s.do(ctx, false, func(t transport.TPM, _ laneState) error {
		var err error
		epoch, err = readCounter(t, b.RevocationIndex())
		return err
	})
	return epoch, err
}

// Revoke advances the key's revocation counter to before (one
// TPM2_NV_Increment per step, each atomic in the TPM), so that every
// approval written at an epoch below before stops satisfying the key. It
// is idempotent: a counter already at or past before is left alone, so an
// interrupted revoke is finished by running it again. It refuses a step
// larger than tpmpolicy.MaxRevokeStep. progress, if not nil, is called
// after each increment with the new value.
func (s *Signer) Revoke(ctx context.Context, before uint64, progress func(uint64)) (from, to uint64, err error) {
	from, err = s.RevocationEpoch(ctx)
	if err != nil {
		return 0, 0, err
	}
	if before > from && before-from > tpmpolicy.MaxRevokeStep {
		return from, from, fmt.Errorf("tpm: revoke --before %d would advance the counter by %d steps from %d; at most %d at a time (a typo?): run it in steps", before, before-from, from, tpmpolicy.MaxRevokeStep)
	}
	for to = from; to < before; {
		next, err := s.revokeStep(ctx, before)
		if err != nil {
			return from, to, err
		}
		if next > to && progress != nil {
			progress(next)
		}
		to = next
	}
	return from, to, nil
}

// revokeStep advances the counter by one if it is still below before,
// reading it first on the same connection, and returns its value after
// the step: another revoke on this TPM (an operator's retry while this
// one runs) may have advanced it meanwhile, and counting steps alone
// would then overshoot before and withdraw the approvals written at it.
func (s *Signer) revokeStep(ctx context.Context, before uint64) (uint64, error) {
	idx := s.km.binding.RevocationIndex()
	var now uint64
	err := s.do(ctx, false, func(t transport.TPM, _ laneState) error {
		var err error
		if now, err = readCounter(t, idx); err != nil || now >= before {
			return err
		}
		if err := incrementCounter(t, idx); err != nil {
			return err
		}
		now++
		return nil
	})
	return now, err
}

// RevocationReport is the revocation state of a revocable key: its
// counter's NV index and value (the current epoch), and its approvals
// split into those the TPM still accepts (epoch >= counter) and those it
// refuses, as "FILE@EPOCH".
type RevocationReport struct {
	Index string   `json:"nvIndex"`
	Epoch uint64   `json:"epoch"`
	Live  []string `json:"live"`
	Dead  []string `json:"dead"`
}

// revocationReport fills r.Revocation for a revocable key.
func (s *Signer) revocationReport(t transport.TPM, r *PolicyReport, approvals []tpmpolicy.CheckedApproval) error {
	b := s.km.binding
	if !b.Revocable() {
		return nil
	}
	epoch, err := readCounter(t, b.RevocationIndex())
	if err != nil {
		return err
	}
	rr := &RevocationReport{Index: fmt.Sprintf("0x%08x", uint32(b.RevocationIndex())), Epoch: epoch, Live: []string{}, Dead: []string{}}
	for _, a := range approvals {
		name := fmt.Sprintf("%s@%d", a.File, a.Epoch)
		if a.Epoch >= epoch {
			rr.Live = append(rr.Live, name)
		} else {
			rr.Dead = append(rr.Dead, name)
		}
	}
	r.Revocation = rr
	return nil
}

// RevocationCounter makes sure the revocation counter of the revocable
// key uri is about to create (revocation=) exists on its TPM, creating it
// if needed, and returns its value: the epoch the ceremony approves the
// initial PCR state at, before the key exists. Generate then adopts the
// same counter.
func (b *Backend) RevocationCounter(ctx context.Context, uri string) (uint64, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return 0, err
	}
	bind := u.binding()
	if !bind.Revocable() {
		return 0, fmt.Errorf("tpm: %s names no revocation counter (revocation=): %w", u, signer.ErrInvalidURI)
	}
	var epoch uint64
	err = b.withConn(ctx, u, func(t transport.TPM) error {
		if err := ensureCounter(t, bind); err != nil {
			return err
		}
		epoch, err = readCounter(t, bind.RevocationIndex())
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("tpm: %w", err)
	}
	return epoch, nil
}

// RevocationEpochOf reads the current epoch of the revocable key uri
// names, from its TPM, without loading the key: what policy approve
// --signer approves at.
func (b *Backend) RevocationEpochOf(ctx context.Context, uri string) (uint64, error) {
	bind, _, err := KeyBinding(uri)
	if err != nil {
		return 0, err
	}
	u, err := ParseURI(uri)
	if err != nil {
		return 0, err
	}
	if !bind.Revocable() {
		return 0, fmt.Errorf("tpm: the key's approvals are not revocable (policy %s)", bind)
	}
	var epoch uint64
	err = b.withConn(ctx, u, func(t transport.TPM) error {
		epoch, err = readCounter(t, bind.RevocationIndex())
		return err
	})
	return epoch, err
}
