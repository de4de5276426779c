package keystore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// ApproveOptions configures Approve.
type ApproveOptions struct {
	// AuthorityURI is the policy authority's key (file: or pkcs11:).
	AuthorityURI string
	// Binding is the binding of the key the approval is for
	// (tpm.KeyBinding of its blob, tpm.CreationBinding of a key about to
	// be made): the approval signs its policyRef, and a selection it does
	// not accept is refused. Required.
	Binding tpmpolicy.Binding
	// PCRs and Values are the approved sha256 PCR state, in PCR order.
	PCRs   []int
	Values [][]byte
	// Source says where the values come from ("tpm", "pcr", "quote"), for
	// the receipt.
	Source string
	// ApprovedBy and Note are informational fields of the approval.
	ApprovedBy string
	Note       string
	// Out receives the approval file (normally in the key's approvals
	// directory).
	Out Target
	// Force allows replacing Out.
	Force bool
	// Epoch is the revocation epoch to approve at, for a revocable key
	// (Binding.Revocable): its counter's current value. 0 for other keys.
	Epoch uint64
}

// Approve signs an approval of a PCR state with the policy authority and
// writes it, with a receipt in receipts. The authority's signature covers
// SHA-256(PolicyPCR digest || the key's policyRef): it lets a TPM key
// created under this authority with that binding sign in that PCR state,
// and nothing else.
func (c *Ceremony) Approve(ctx context.Context, receipts Dir, o ApproveOptions) (_ *Outcome, err error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	p, err := c.planApproval(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("policy approve: %w", err)
	}
	res, err := c.record(receipts, p)
	if err != nil {
		return nil, fmt.Errorf("policy approve: %w", err)
	}
	return res, nil
}

// planApproval signs the approval o asks for with the policy authority
// and plans its file and receipt.
func (c *Ceremony) planApproval(ctx context.Context, o ApproveOptions) (*plan, error) {
	auth, err := c.Keys.Open(signer.WithKeyRole(ctx, signer.RoleAuthority), o.AuthorityURI)
	if err != nil {
		return nil, fmt.Errorf("open the policy authority: %w%s", err, AuthorityHint(err))
	}
	defer closeKey(auth, &err)
	approvedBy := o.ApprovedBy
	if approvedBy == "" {
		approvedBy = auth.Describe().Fingerprint
	}
	a, err := tpmpolicy.SignApproval(auth, o.Binding, o.PCRs, o.Values, tpmpolicy.ApprovalMeta{Epoch: o.Epoch, ApprovedBy: approvedBy, Note: o.Note, CreatedAt: c.now()})
	if err != nil {
		return nil, err
	}
	data, err := tpmpolicy.MarshalApprovals(a)
	if err != nil {
		return nil, err
	}
	r := newReceipt(opPolicyApprove, auth.Describe())
	r.Details = approvalDetails(a, o.Source)
	r.Details["binding"] = o.Binding.String()
	if a.Epoch != 0 {
		r.Details["epoch"] = strconv.FormatUint(a.Epoch, 10)
	}
	return &plan{receipt: r, outputs: []placement{{Dir: o.Out.Dir, File: File{Name: o.Out.Name, Data: data, Mode: 0o644}, Overwrite: o.Force}}, notes: []string{
		"approval of sha256:" + pcrString(a.PCRs) + " (PolicyPCR digest " + a.Pol + ", policyRef " + strconv.Quote(a.Ref) + ") by authority " + a.PKFP + "; copy it into the approvals directory of every node in this PCR state (a ConfigMap is fine: it is not secret)",
	}}, nil
}

// AuthorityHint is what to add to an error opening a policy authority
// key: how to create one, when it does not exist.
func AuthorityHint(err error) string {
	if !errors.Is(err, signer.ErrKeyNotFound) {
		return ""
	}
	return "; to create a policy authority key (offline, or on an HSM): steward-trustd-ceremony policy authority create --key file:/offline/authority.key [--algorithm rsa3072 to share it with systemd-measure] --public-out authority.pub"
}

// approvalDetails are the receipt details of an approval.
func approvalDetails(a *tpmpolicy.Approval, source string) map[string]string {
	d := map[string]string{"pcrs": pcrString(a.PCRs), "pol": a.Pol, "ref": a.Ref, "authority": a.PKFP, "source": source}
	for p, v := range a.PCRValues {
		d["pcr"+p] = v
	}
	if a.Note != "" {
		d["note"] = a.Note
	}
	return d
}

func pcrString(pcrs []int) string {
	s := make([]string, len(pcrs))
	for i, p := range pcrs {
		s[i] = fmt.Sprint(p)
	}
	return strings.Join(s, ",")
}
