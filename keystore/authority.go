package keystore

// Keys created under policy authorities (signed PCR policies, see
// signer/tpm/README.md): the ceremony approves the TPM's PCR values of
// the moment with the first authority before the key exists, so that it
// can sign with the key at once.

import (
	"context"
	"crypto"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// Authorities asks for a TPM key created under policy authorities
// instead of fixed PCR values. The zero value asks for none.
type Authorities struct {
	// URIs name the authorities' keys (file: or pkcs11:). The first
	// approves the PCR values the TPM has when the key is created; two
	// or more make a break-glass PolicyOR.
	URIs []string
	// PCRs reads those values and, for a revocable key, the epoch of its
	// revocation counter (signer/tpm's Backend).
	PCRs TPMReader
}

// TPMReader reads what the first approval of a key about to be created
// depends on: the TPM's current values of the sha256 PCRs a tpm: key URI
// selects, and the revocation counter a revocable one (revocation=) names.
type TPMReader interface {
	ReadPCRValues(ctx context.Context, uri string) ([]int, [][]byte, error)
	// RevocationCounter creates the counter if it is missing and returns
	// its value: the epoch the initial approval is written at.
	RevocationCounter(ctx context.Context, uri string) (uint64, error)
}

// underAuthorities returns uri bound to a's authorities (tpm.WithAuthorities),
// after approving the TPM's current PCR values for the key with the first
// authority: the approval goes into the key's approvals directory, its
// receipt into st, and what was done into st.earlier. It runs under st's
// lock; an approval of these values already in place is an earlier run's
// and is kept, not signed again.
func (c *Ceremony) underAuthorities(ctx context.Context, st *state, uri string, a Authorities) (string, error) {
	if len(a.URIs) == 0 {
		return uri, nil
	}
	if a.PCRs == nil {
		return "", errors.New("policy authorities: nothing reads the TPM's PCR values")
	}
	out, err := c.authorityURI(ctx, uri, a.URIs)
	if err != nil {
		return "", err
	}
	o, err := initialApproval(ctx, out, a)
	if err != nil {
		return "", err
	}
	o.AuthorityURI = a.URIs[0]
	st.earlier.Notes = append(st.earlier.Notes, "key policy: "+o.Binding.String())
	resumed, err := approvalResumed(st, &o)
	if err != nil || resumed {
		return out, err
	}
	p, err := c.planApproval(ctx, o)
	if err != nil {
		return "", fmt.Errorf("approve the current PCR values: %w", err)
	}
	done, err := c.commit(st, p)
	if err != nil {
		return "", fmt.Errorf("approve the current PCR values: %w", err)
	}
	st.earlier.Written = done.Written
	st.earlier.Notes = append(st.earlier.Notes, p.notes...)
	return out, nil
}

// approvalResumed reports whether the approval o would write is in place
// and recorded by an earlier run, noting it in st.earlier. An approval
// there without a receipt is a run's killed between the two writes: it
// is approved again (o.Force), so that a receipt vouches for it.
func approvalResumed(st *state, o *ApproveOptions) (bool, error) {
	path := o.Out.Dir.Path(o.Out.Name)
	b, err := readOptional(o.Out.Dir, o.Out.Name)
	switch {
	case err != nil || b == nil:
		return false, err
	case st.recorded(opPolicyApprove, path):
		st.earlier.Resumed = append(st.earlier.Resumed, "approval "+path+" of the current PCR values was written by an earlier run")
		return true, nil
	}
	st.earlier.Resumed = append(st.earlier.Resumed, "approval "+path+" has no receipt here (a run killed before writing it): approved again")
	o.Force = true
	return false, nil
}

// authorityURI returns uri with the public keys of the authorities at
// uris (tpm.WithAuthorities).
func (c *Ceremony) authorityURI(ctx context.Context, uri string, uris []string) (string, error) {
	pubs := make([]crypto.PublicKey, 0, len(uris))
	for _, u := range uris {
		s, err := c.Keys.Open(signer.WithKeyRole(ctx, signer.RoleAuthority), u)
		if err != nil {
			return "", fmt.Errorf("open policy authority: %w%s", err, AuthorityHint(err))
		}
		pubs = append(pubs, s.Public())
		if err := s.Close(); err != nil {
			return "", fmt.Errorf("close policy authority %s: %w", s.Describe().Location, err)
		}
	}
	return tpm.WithAuthorities(uri, pubs)
}

// initialApproval is the approval of the TPM's current PCR values for
// the key about to be created at uri, named after their PolicyPCR digest
// in the key's approvals directory.
func initialApproval(ctx context.Context, uri string, a Authorities) (ApproveOptions, error) {
	u, err := tpm.ParseURI(uri)
	if err != nil {
		return ApproveOptions{}, err
	}
	if u.Approvals == "" {
		return ApproveOptions{}, fmt.Errorf("%w: a key under a policy authority needs its approvals directory (add ;approvals=/dir to the key URI)", signer.ErrInvalidURI)
	}
	binding, err := tpm.CreationBinding(uri)
	if err != nil {
		return ApproveOptions{}, err
	}
	pcrs, vals, err := a.PCRs.ReadPCRValues(ctx, uri)
	if err != nil {
		return ApproveOptions{}, err
	}
	pol, err := tpmpolicy.PCRPolicyDigest(pcrs, vals)
	if err != nil {
		return ApproveOptions{}, err
	}
	epoch, err := initialEpoch(ctx, uri, binding, a.PCRs)
	if err != nil {
		return ApproveOptions{}, err
	}
	return ApproveOptions{
		Binding: binding, PCRs: pcrs, Values: vals, Source: "tpm", Note: "PCR values when the key was created", Epoch: epoch,
		Out: Target{Dir: OSDir{Root: u.Approvals}, Name: "initial-" + hex.EncodeToString(pol)[:16] + ".json"},
	}, nil
}

// initialEpoch is the epoch the first approval of a key about to be
// created is written at: the revocation counter's value for a revocable
// key (made if missing, so that the key adopts it), none otherwise.
func initialEpoch(ctx context.Context, uri string, b tpmpolicy.Binding, r TPMReader) (uint64, error) {
	if !b.Revocable() {
		return 0, nil
	}
	return r.RevocationCounter(ctx, uri)
}
