package tpm

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// authorizedState is what a Signer of a key under policy authorities keeps
// between signatures: the VerifySignature tickets, so that each approval's
// signature is verified by the TPM once, and the approval that matched
// last, so that the steady state costs PolicyPCR, PolicyAuthorize,
// PolicyCommandCode (and PolicyOR) and Sign.
//
// Signer.mu serializes operations, but runBounded abandons an operation
// that timed out, and its goroutine may get a late answer from the TPM
// (a device read that Close does not interrupt) and come here after
// Signer.mu was released: so the state, and the approvals directory, have
// their own mutex, never held across TPM I/O.
type authorizedState struct {
	mu      sync.Mutex
	tickets map[string]tpm2.TPMTTKVerified // by ticketKey
	last    *tpmpolicy.CheckedApproval
}

func (st *authorizedState) lastApproval() *tpmpolicy.CheckedApproval {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.last
}

func (st *authorizedState) setLast(a *tpmpolicy.CheckedApproval) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.last = a
}

func (st *authorizedState) ticket(key string) (tpm2.TPMTTKVerified, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	tk, ok := st.tickets[key]
	return tk, ok
}

func (st *authorizedState) putTicket(key string, tk tpm2.TPMTTKVerified) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.tickets == nil || len(st.tickets) >= maxTickets {
		// Bounded: approvals come and go; the ones in use are verified again.
		st.tickets = map[string]tpm2.TPMTTKVerified{}
	}
	st.tickets[key] = tk
}

func (st *authorizedState) dropTicket(key string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.tickets, key)
}

// approvals returns the usable approvals, newest first, re-reading the
// directory as tpmpolicy.ApprovalDir.Current does. The copy is the caller's: the
// approval remembered as last stays what it was across re-reads.
func (s *Signer) approvals(force bool) []tpmpolicy.CheckedApproval {
	s.auth.mu.Lock()
	defer s.auth.mu.Unlock()
	return slices.Clone(s.km.approvals.Current(force))
}

func approvalKey(a *tpmpolicy.CheckedApproval) string {
	return a.File + "/" + hex.EncodeToString(a.Pol)
}

// ticketKey names what a VerifySignature ticket proves: that authority
// a.auth signed a.pol with a.ref (the ticket covers the signed digest and
// the key's name, TPM 2.0 Part 3 §20.1), not which file held the approval,
// so a file replaced by another authority's approval of the same state
// does not reuse a ticket PolicyAuthorize would refuse.
func ticketKey(a *tpmpolicy.CheckedApproval) string {
	return strconv.Itoa(a.Auth) + "/" + strconv.Quote(a.Ref) + "/" + hex.EncodeToString(a.Pol)
}

// maxTickets bounds the cached VerifySignature tickets.
const maxTickets = 2 * tpmpolicy.MaxApprovalFiles

// errNoMatch marks a PCR state no approval covers (internal).
var errNoMatch = errors.New("no approval matches")

// runAuthorized satisfies a signed policy in sess: PolicyPCR over the
// approved selection, PolicyAuthorize with the approval's ticket (TPM 2.0
// Part 3 §23.16), PolicyCommandCode(Sign) and, with several authorities,
// PolicyOR (§23.6).
func (s *Signer) runAuthorized(t transport.TPM, sess tpm2.TPMHandle) error {
	approvals := s.approvals(false)
	if last := s.auth.lastApproval(); last != nil && slices.ContainsFunc(approvals, func(a tpmpolicy.CheckedApproval) bool { return approvalKey(&a) == approvalKey(last) }) {
		err := s.authorizeWith(t, sess, last, true)
		if !errors.Is(err, errNoMatch) {
			return err
		}
		if err := policyRestart(t, sess); err != nil {
			return err
		}
	}
	s.auth.setLast(nil)
	a, err := s.selectApproval(t, sess, approvals)
	if err != nil {
		return err
	}
	if err := s.authorizeWith(t, sess, a, false); err != nil {
		return err
	}
	s.auth.setLast(a)
	return nil
}

// selectApproval finds the newest approval whose pol equals the session
// digest after PolicyPCR over its selection (as Talos's unseal does),
// leaving sess with that PolicyPCR applied. One PolicyPCR per distinct
// selection; PolicyRestart between them.
func (s *Signer) selectApproval(t transport.TPM, sess tpm2.TPMHandle, approvals []tpmpolicy.CheckedApproval) (*tpmpolicy.CheckedApproval, error) {
	var tried [][]int
	var dead *tpmpolicy.CheckedApproval
	for i := range approvals {
		sel := approvals[i].PCRs
		if slices.ContainsFunc(tried, func(x []int) bool { return slices.Equal(x, sel) }) {
			continue
		}
		tried = append(tried, sel)
		digest, err := policyPCRDigest(t, sess, sel)
		if err != nil {
			return nil, err
		}
		a, revoked, err := s.matchInSession(t, sess, approvals[i:], sel, digest)
		if a != nil || err != nil {
			return a, err
		}
		dead = cmp.Or(dead, revoked)
		if err := policyRestart(t, sess); err != nil {
			return nil, err
		}
	}
	if dead != nil {
		return nil, s.revokedErr(t, dead)
	}
	return nil, s.noApprovalErr(t, len(approvals))
}

// matchInSession returns the first of approvals over selection sel whose
// PolicyPCR digest is digest (the session's) and, for a revocable key,
// whose epoch the TPM accepts (PolicyNV run in sess); revoked is the
// first whose epoch it refused.
func (s *Signer) matchInSession(t transport.TPM, sess tpm2.TPMHandle, approvals []tpmpolicy.CheckedApproval, sel []int, digest []byte) (a, revoked *tpmpolicy.CheckedApproval, err error) {
	for j := range approvals {
		if !slices.Equal(approvals[j].PCRs, sel) || !bytes.Equal(approvals[j].PCRPol, digest) {
			continue
		}
		err := s.policyEpoch(t, sess, &approvals[j])
		switch {
		case err == nil:
			return &approvals[j], nil, nil
		case !errors.Is(err, errRevoked):
			return nil, nil, err
		}
		revoked = cmp.Or(revoked, &approvals[j])
	}
	return nil, revoked, nil
}

// policyPCRDigest runs PolicyPCR(sel) with no expected digest (the TPM
// takes the PCRs as they are) and returns the session digest.
func policyPCRDigest(t transport.TPM, sess tpm2.TPMHandle, sel []int) ([]byte, error) {
	if _, err := (tpm2.PolicyPCR{PolicySession: sess, Pcrs: tpmpolicy.PCRSelection(sel)}).Execute(t); err != nil {
		return nil, fmt.Errorf("TPM2_PolicyPCR: %w", err)
	}
	rsp, err := tpm2.PolicyGetDigest{PolicySession: sess}.Execute(t)
	if err != nil {
		return nil, fmt.Errorf("TPM2_PolicyGetDigest: %w", err)
	}
	return rsp.PolicyDigest.Buffer, nil
}

// authorizeWith completes the policy with approval a. With pcr set it runs
// PolicyPCR first (the remembered approval); a PCR state that moved on
// then fails PolicyAuthorize with TPM_RC_VALUE, reported as errNoMatch.
func (s *Signer) authorizeWith(t transport.TPM, sess tpm2.TPMHandle, a *tpmpolicy.CheckedApproval, pcr bool) error {
	if pcr {
		if _, err := (tpm2.PolicyPCR{PolicySession: sess, Pcrs: tpmpolicy.PCRSelection(a.PCRs)}).Execute(t); err != nil {
			return fmt.Errorf("TPM2_PolicyPCR: %w", err)
		}
		if err := s.policyEpoch(t, sess, a); errors.Is(err, errRevoked) {
			return errNoMatch
		} else if err != nil {
			return err
		}
	}
	ticket, err := s.ticket(t, a)
	if err != nil {
		return err
	}
	auth := s.km.authorities[a.Auth]
	_, err = tpm2.PolicyAuthorize{
		PolicySession:  sess,
		ApprovedPolicy: tpm2.TPM2BDigest{Buffer: a.Pol},
		PolicyRef:      tpm2.TPM2BDigest{Buffer: []byte(a.Ref)},
		KeySign:        auth.TPMName(),
		CheckTicket:    ticket,
	}.Execute(t)
	switch {
	case pcr && errors.Is(err, tpm2.TPMRCValue):
		return errNoMatch
	case err != nil:
		s.auth.dropTicket(ticketKey(a)) // a ticket of a cleared owner hierarchy
		return fmt.Errorf("TPM2_PolicyAuthorize (approval %s): %w", a.File, err)
	}
	return s.finishBranch(t, sess)
}

// finishBranch runs the key's own trailing PolicyCommandCode(Sign), then
// PolicyOR over the authorities' branches when there are several.
func (s *Signer) finishBranch(t transport.TPM, sess tpm2.TPMHandle) error {
	if _, err := (tpm2.PolicyCommandCode{PolicySession: sess, Code: tpm2.TPMCCSign}).Execute(t); err != nil {
		return fmt.Errorf("TPM2_PolicyCommandCode: %w", err)
	}
	if len(s.km.branches) < 2 {
		return nil
	}
	if _, err := (tpm2.PolicyOr{PolicySession: sess, PHashList: tpmpolicy.DigestList(s.km.branches)}).Execute(t); err != nil {
		return fmt.Errorf("TPM2_PolicyOR: %w", err)
	}
	return nil
}

// ticket returns the TPM's VerifySignature ticket for approval a, asking
// the TPM only the first time: the authority's public key is loaded with
// TPM2_LoadExternal in the OWNER hierarchy (in the NULL hierarchy the
// ticket would be a NULL ticket that PolicyAuthorize refuses), the
// signature verified (TPM 2.0 Part 3 §20.1), the key flushed.
// PolicyAuthorize needs only the authority's name afterwards.
func (s *Signer) ticket(t transport.TPM, a *tpmpolicy.CheckedApproval) (tpm2.TPMTTKVerified, error) {
	if tk, ok := s.auth.ticket(ticketKey(a)); ok {
		return tk, nil
	}
	auth := s.km.authorities[a.Auth]
	load, err := tpm2.LoadExternal{InPublic: tpm2.New2B(auth.PublicArea()), Hierarchy: tpm2.TPMRHOwner}.Execute(t)
	if err != nil {
		return tpm2.TPMTTKVerified{}, fmt.Errorf("load policy authority %s (TPM2_LoadExternal): %w", auth.Fingerprint(), err)
	}
	defer flush(t, load.ObjectHandle)
	rsp, err := tpm2.VerifySignature{
		KeyHandle: load.ObjectHandle,
		Digest:    tpm2.TPM2BDigest{Buffer: tpmpolicy.ApprovalDigest(a.Pol, a.Ref)},
		Signature: a.Sig,
	}.Execute(t)
	if err != nil {
		return tpm2.TPMTTKVerified{}, fmt.Errorf("approval %s: the TPM refuses the authority's signature (TPM2_VerifySignature): %w: %w", a.File, signer.ErrPolicyNotSatisfied, err)
	}
	s.auth.putTicket(ticketKey(a), rsp.Validation)
	return rsp.Validation, nil
}

// noApprovalErr says that no approval covers the current PCR state, with
// exactly what an approver needs: the values of the key's PCRs and their
// PolicyPCR digest.
func (s *Signer) noApprovalErr(t transport.TPM, n int) error {
	vals, err := ReadPCRs(t, s.km.pcrs)
	if err != nil {
		return fmt.Errorf("tpm: no approval matches the PCR state (%d approvals in %s): %w", n, s.uri.Approvals, signer.ErrPolicyNotSatisfied)
	}
	pol, err := tpmpolicy.PCRPolicyDigest(s.km.pcrs, vals)
	if err != nil {
		return err
	}
	flags := make([]string, len(vals))
	for i, p := range s.km.pcrs {
		flags[i] = fmt.Sprintf("--pcr %d=%x", p, vals[i])
	}
	return fmt.Errorf("tpm: no approval in %s (%d usable) matches this TPM's PCR state: sha256 PolicyPCR digest %x; "+
		"if this state is legitimate, approve it with the policy authority: steward-trustd-ceremony policy approve --authority AUTHORITY_URI %s %s --out %s/NAME.json: %w",
		s.uri.Approvals, n, pol, s.keyArg(), strings.Join(flags, " "), s.uri.Approvals, signer.ErrPolicyNotSatisfied)
}

// keyArg names the key for policy approve in messages: --key and its blob
// file (not secret; the approver reads the key's binding from it), or
// --signer and the URI of a persistent key.
func (s *Signer) keyArg() string {
	if s.uri.Path != "" {
		return "--key " + s.uri.Path
	}
	return "--signer '" + s.uri.String() + "'"
}

// policyRestart resets a policy session (TPM2_PolicyRestart, TPM 2.0 Part 3
// §23.17), which go-tpm v0.9.8 does not implement: a raw command with no
// sessions.
func policyRestart(t transport.TPM, sess tpm2.TPMHandle) error {
	cmd := make([]byte, 14)
	binary.BigEndian.PutUint16(cmd[0:], uint16(tpm2.TPMSTNoSessions))
	binary.BigEndian.PutUint32(cmd[2:], 14)
	binary.BigEndian.PutUint32(cmd[6:], uint32(tpm2.TPMCCPolicyRestart))
	binary.BigEndian.PutUint32(cmd[10:], uint32(sess))
	rsp, err := t.Send(cmd)
	if err != nil {
		return fmt.Errorf("TPM2_PolicyRestart: %w", err)
	}
	if len(rsp) < 10 {
		return errors.New("TPM2_PolicyRestart: short response")
	}
	if rc := tpm2.TPMRC(binary.BigEndian.Uint32(rsp[6:10])); rc != tpm2.TPMRCSuccess {
		return fmt.Errorf("TPM2_PolicyRestart: %w", rc)
	}
	return nil
}

// PolicyReport tells an operator how a key under policy authorities
// stands: its authorities, the current PCR state, and which approval (if
// any) lets it sign now.
type PolicyReport struct {
	Authorities []AuthorityReport `json:"authorities"`
	// Binding is how the key binds approvals ("v2", "systemd" or "v1"),
	// PolicyRef the ref its PolicyAuthorize names, BoundPCRs the one
	// selection it accepts (none for v1), and Warning what a weaker
	// binding lets through and what to do (empty for v2).
	Binding      string `json:"binding"`
	PolicyRef    string `json:"policyRef"`
	BoundPCRs    []int  `json:"boundPCRs,omitempty"`
	Warning      string `json:"warning,omitempty"`
	ApprovalsDir string `json:"approvalsDir"`
	// Approvals counts the usable approvals (malformed, tampered and
	// foreign ones are not counted).
	Approvals int `json:"approvals"`
	// PCRValues and PolicyPCRDigest are the current state of the key's
	// PCR selection (pcrs=, default 7): the input of `policy approve`.
	PCRValues       map[string]string `json:"pcrValues"`
	PolicyPCRDigest string            `json:"policyPCRDigest"`
	// Matching is the approval file that satisfies the policy now; empty
	// when none does (MatchError then says why).
	Matching   string `json:"matching,omitempty"`
	MatchError string `json:"matchError,omitempty"`
	// Revocation is set for a revocable key: its counter and which
	// approvals it still accepts.
	Revocation *RevocationReport `json:"revocation,omitempty"`
}

// AuthorityReport names one policy authority: its TPM name, our
// fingerprint (SHA-256 of the DER SubjectPublicKeyInfo) and, for an RSA
// authority, systemd-measure's (SHA-256 of the DER PKCS#1 RSAPublicKey);
// an approval's pkfp may be either.
type AuthorityReport struct {
	Name               string `json:"name"`
	Fingerprint        string `json:"fingerprint"`
	SystemdFingerprint string `json:"systemdFingerprint,omitempty"`
}

// PolicyReport reports on the key's signed policy without signing; nil
// for a PCR-bound key.
func (s *Signer) PolicyReport(ctx context.Context) (*PolicyReport, error) {
	if len(s.km.authorities) == 0 {
		return nil, nil
	}
	b := s.km.binding
	r := &PolicyReport{ApprovalsDir: s.uri.Approvals, Binding: b.Mode(), PolicyRef: b.Ref(), BoundPCRs: b.PCRs(), Warning: b.Weakness()}
	for _, a := range s.km.authorities {
		r.Authorities = append(r.Authorities, AuthorityReport{Name: hex.EncodeToString(a.TPMName().Buffer), Fingerprint: a.Fingerprint(), SystemdFingerprint: a.SystemdFingerprint()})
	}
	err := s.do(ctx, false, func(t transport.TPM, _ laneState) error {
		vals, err := ReadPCRs(t, s.km.pcrs)
		if err != nil {
			return err
		}
		pol, err := tpmpolicy.PCRPolicyDigest(s.km.pcrs, vals)
		if err != nil {
			return err
		}
		r.PCRValues, r.PolicyPCRDigest = tpmpolicy.HexValues(s.km.pcrs, vals), hex.EncodeToString(pol)
		approvals := s.approvals(true)
		r.Approvals = len(approvals)
		if err := s.revocationReport(t, r, approvals); err != nil {
			return err
		}
		return s.matchReport(t, r)
	})
	return r, err
}

// matchReport runs the signed policy on a fresh session and records the
// approval that satisfies it.
func (s *Signer) matchReport(t transport.TPM, r *PolicyReport) error {
	sess, closeSess, err := tpm2.PolicySession(t, tpm2.TPMAlgSHA256, 16)
	if err != nil {
		return fmt.Errorf("start policy session (TPM2_StartAuthSession): %w", err)
	}
	defer closeSess() //nolint:errcheck // flushing a session we are done with
	s.auth.setLast(nil)
	if err := s.runAuthorized(t, sess.Handle()); err != nil {
		if !errors.Is(err, signer.ErrPolicyNotSatisfied) {
			return err
		}
		r.MatchError = err.Error()
		return nil
	}
	if last := s.auth.lastApproval(); last != nil {
		r.Matching = filepath.Join(s.uri.Approvals, last.File)
	}
	return nil
}
