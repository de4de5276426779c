package tpm

import (
	"context"
	"fmt"

	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// KeyBinding reads the binding and authorities of the key under policy
// authorities that uri names, without a TPM: from its blob file (not
// secret: an approver may hold a copy), or, for a persistent handle,
// which records nothing, from the URI itself (pcrs=, systemd=; no
// authorities). A key bound to fixed PCR values is refused: it takes no
// approvals.
func KeyBinding(uri string) (tpmpolicy.Binding, []*tpmpolicy.Authority, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return tpmpolicy.Binding{}, nil, err
	}
	if u.Path == "" {
		return u.binding(), nil, nil
	}
	k, err := readBlobFile(u)
	if err != nil {
		return tpmpolicy.Binding{}, nil, err
	}
	if len(k.authorities) == 0 {
		return tpmpolicy.Binding{}, nil, fmt.Errorf("tpm: key blob %s is bound to fixed PCR values (sha256:%s), not under a policy authority: it takes no approvals", u.Path, tpmpolicy.PCRList(k.pcrs))
	}
	return k.binding, k.authorities, nil
}

// CreationBinding is the binding a key created at uri gets (Generate,
// Import): systemd for systemd=true, else v2 over its pcrs= (default 7).
// It is what the ceremony approves before the key exists.
func CreationBinding(uri string) (tpmpolicy.Binding, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return tpmpolicy.Binding{}, err
	}
	return u.binding(), nil
}

// ReadPCRValues reads the current sha256 values of the PCRs uri selects
// (pcrs=, default 7) from the TPM uri names, without opening a key: what
// the ceremony approves before it creates a key under an authority.
func (b *Backend) ReadPCRValues(ctx context.Context, uri string) ([]int, [][]byte, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return nil, nil, err
	}
	var vals [][]byte
	err = b.withConn(ctx, u, func(t transport.TPM) error {
		vals, err = ReadPCRs(t, u.PCRs)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("tpm: read PCRs %s: %w", tpmpolicy.PCRList(u.PCRs), err)
	}
	return u.PCRs, vals, nil
}
