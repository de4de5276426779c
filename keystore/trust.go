package keystore

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"strconv"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// TrustOptions configures Trust.
type TrustOptions struct {
	// SignerURI is the root key (os-ca.crt's).
	SignerURI string
	// Root is the root certificate given on the command line; it must be
	// the directory's os-ca.crt.
	Root *x509.Certificate
	// CA is the CA to vouch for, or with Remove to stop vouching for.
	CA *x509.Certificate
	// Remove takes CA out of accepted-cas.crt and the statement.
	Remove bool
}

// Trust adds o.CA to accepted-cas.crt (or removes it) and has the root
// key sign the new trust statement (certdir.TrustStatement), numbered
// after the directory's: the daemon serves an accepted CA only when that
// statement names it, and refuses an older statement. The Secret and the
// worker patch follow. A re-run after a crash finds the statement already
// saying so and completes without signing again.
func (c *Ceremony) Trust(ctx context.Context, d Dir, o TrustOptions) (_ *Outcome, err error) {
	op := trustOp(o.Remove)
	st, unlock, err := c.begin(d)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	defer unlock()
	accepted, err := trustChange(st, o)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	key, err := c.OpenCA(ctx, o.SignerURI, st.ca)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	defer closeKey(key, &err)
	statement, err := c.vouch(st, key, st.ca, accepted)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	p, err := planTrust(st, o, key.Describe(), accepted, statement)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return c.commit(st, p)
}

func trustOp(remove bool) Operation {
	if remove {
		return opTrustDrop
	}
	return opTrustAdd
}

// trustChange checks o against the state and returns the accepted CAs
// after the change.
func trustChange(st *state, o TrustOptions) ([]*x509.Certificate, error) {
	cur, _, err := st.currentCA()
	switch {
	case err != nil:
		return nil, err
	case o.Root == nil || !cur.Equal(o.Root):
		return nil, fmt.Errorf("--ca is not %s: give the root the directory serves", st.dir.Path(certdir.FileCACert))
	case o.CA.Equal(cur):
		return nil, errors.New("the root is always served; it needs no statement")
	case o.Remove && st.next != nil && o.CA.Equal(st.next):
		return nil, fmt.Errorf("CA %s is the new CA of the rotation in progress; finish the rotation (rotate --finish) instead", pki.CertFingerprint(o.CA))
	case o.Remove:
		return without(st.accepted, o.CA), nil
	}
	if err := pki.CheckClientCA(o.CA); err != nil {
		return nil, fmt.Errorf("CA %s: %w", pki.CertFingerprint(o.CA), err)
	}
	return certdir.Unique(append(st.accepted, o.CA)...), nil
}

// planTrust decides the files and the receipt of a trust change.
func planTrust(st *state, o TrustOptions, key signer.Description, accepted []*x509.Certificate, statement vouched) (*plan, error) {
	cur, token, err := st.currentCA()
	if err != nil {
		return nil, err
	}
	op := trustOp(o.Remove)
	p := &plan{op: string(op)}
	files, err := clusterFiles(secretCluster(cur), cur, accepted, token, st.serverFiles(), statement.data)
	if err != nil {
		return nil, err
	}
	if st.matches(files) && st.receipt(op, key.Fingerprint, pki.CertFingerprint(o.CA)) != nil {
		p.alreadyDone = true
		return p, nil
	}
	p.files = files
	p.receipt = newReceipt(op, key)
	certReceipt(&p.receipt, o.CA)
	p.receipt.Details = map[string]string{"rootFingerprint": pki.CertFingerprint(cur), "statementSequence": strconv.FormatUint(statement.seq, 10), "vouchedCAs": strconv.Itoa(len(accepted))}
	p.notes = []string{
		"deploy the updated " + st.dir.Path(certdir.FileKubernetesSecret) + " (or copy " + certdir.FileAcceptedCAs + " and " + certdir.FileTrustStatement + " into the daemon's cert dir): the daemon reloads them and logs the change of its ca set at WARN",
		"apply " + st.dir.Path(certdir.FileWorkerPatch) + " to every worker so that machine.acceptedCAs agrees",
	}
	return p, nil
}

// trustStatement returns the directory's statement, checked against the
// root that signed it: os-ca.crt, or os-ca.next.crt during a rotation's
// finish. Nil without one; an error for one no root of the directory
// signed (someone edited it: the ceremony will not number after it).
func (st *state) trustStatement() (*certdir.TrustStatement, error) {
	data, ok := st.files[certdir.FileTrustStatement]
	if !ok {
		return nil, nil
	}
	var errs []error
	for _, root := range []*x509.Certificate{st.ca, st.next} {
		if root == nil {
			continue
		}
		s, err := certdir.ParseTrustStatement(data, root)
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("%s: %w; restore the statement the ceremony wrote (receipts name it) or remove it and vouch again", st.dir.Path(certdir.FileTrustStatement), errors.Join(errs...))
}

// vouched is a statement file and its sequence number.
type vouched struct {
	data []byte
	seq  uint64
}

// vouch returns the statement by root (key) for accepted: the directory's
// own if it says exactly that already (a re-run signs nothing new), else
// a new one numbered after it.
func (c *Ceremony) vouch(st *state, key crypto.Signer, root *x509.Certificate, accepted []*x509.Certificate) (vouched, error) {
	prev, err := st.trustStatement()
	if err != nil {
		return vouched{}, err
	}
	if prev != nil && prev.Root == pki.CertFingerprint(root) && prev.SameSet(accepted) {
		return vouched{st.files[certdir.FileTrustStatement], prev.Sequence}, nil
	}
	v := vouched{seq: 1}
	if prev != nil {
		v.seq = prev.Sequence + 1
	}
	if v.data, err = certdir.SignTrustStatement(key, c.Rand, certdir.NewTrustStatement(root, v.seq, c.now(), accepted)); err != nil {
		return vouched{}, err
	}
	c.step("trust statement signed")
	return v, nil
}
