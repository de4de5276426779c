package keystore

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// IntermediateRotate starts rotating a node's intermediate in its cert
// dir d (which holds os-ca.crt and issuer.crt): a new key at
// o.SignerURI, created as IntermediateRequest creates it, and its
// request in d/issuer.next.csr for the root to sign into
// d/issuer.next.crt. The running daemon keeps signing with the old key
// meanwhile; workers trust only the root, so certificates from either
// intermediate verify throughout. Finish with IntermediateRotateFinish.
func (c *Ceremony) IntermediateRotate(ctx context.Context, d Dir, o IntermediateRequestOptions) (*Outcome, error) {
	o.Out = Target{Dir: d, Name: certdir.FileNextIssuerCSR}
	if err := c.refuseCurrentIssuerKey(ctx, d, o.SignerURI); err != nil {
		return nil, fmt.Errorf("rotate --intermediate: %w", err)
	}
	out, err := c.IntermediateRequest(ctx, d, o)
	if err != nil {
		return nil, fmt.Errorf("rotate --intermediate: %w", err)
	}
	out.Notes = []string{
		"on the root's host: steward-trustd-ceremony intermediate sign --csr " + d.Path(certdir.FileNextIssuerCSR) + " --out issuer.next.crt ...; put issuer.next.crt into " + d.Path(""),
		"then: steward-trustd-ceremony rotate --intermediate --finish --new-signer URI --out " + d.Path(""),
	}
	return out, nil
}

// refuseCurrentIssuerKey refuses a rotation to the key that d's
// issuer.crt already certifies, as Rotate refuses the current CA's key:
// that key would be "rotated" to itself, and kept past the rotation that
// was meant to retire it. A key not there yet, or an issuer.crt that
// does not parse (a rotation is its remedy), is no reason to refuse.
func (c *Ceremony) refuseCurrentIssuerKey(ctx context.Context, d Dir, uri string) (err error) {
	b, err := readOptional(d, certdir.FileIssuerChain)
	if err != nil || b == nil {
		return err
	}
	chain, err := pki.ParseCertificates(b)
	if err != nil || len(chain) == 0 {
		return nil
	}
	s, err := c.Keys.Open(ctx, uri)
	if err != nil {
		return nil // IntermediateRequest creates it, or reports why not
	}
	defer closeKey(s, &err)
	if pki.KeyMatchesCert(s.Public(), chain[0]) {
		return fmt.Errorf("%w: the key at --new-signer is the current intermediate's (%s); a rotation needs a new key location", signer.ErrKeyExists, d.Path(certdir.FileIssuerChain))
	}
	return nil
}

// IntermediateRotateFinish finishes an intermediate rotation in d:
// issuer.next.crt must be the new key's (newURI, which must sign) and
// pass the daemon's checks against os-ca.crt and accepted-cas.crt; it
// becomes issuer.crt, and issuer.next.crt and issuer.next.csr go.
func (c *Ceremony) IntermediateRotateFinish(ctx context.Context, d Dir, newURI string) (_ *Outcome, err error) {
	st, unlock, err := c.begin(d)
	if err != nil {
		return nil, fmt.Errorf("rotate --intermediate --finish: %w", err)
	}
	defer unlock()
	next, err := readNextIssuer(st)
	if err != nil {
		return nil, fmt.Errorf("rotate --intermediate --finish: %w", err)
	}
	key, err := c.Keys.Open(ctx, newURI)
	if err != nil {
		return nil, fmt.Errorf("rotate --intermediate --finish: open the new key: %w", err)
	}
	defer closeKey(key, &err)
	if err := checkNextIssuer(st, next, key, c); err != nil {
		return nil, fmt.Errorf("rotate --intermediate --finish: %w", err)
	}
	return c.commit(st, planIntermediateFinish(st, next, key.Describe()))
}

// readNextIssuer reads issuer.next.crt; nil, nil when it is gone (the
// rotation was finished, or not started).
func readNextIssuer(st *state) ([]*x509.Certificate, error) {
	b, err := readOptional(st.dir, certdir.FileNextIssuerChain)
	if err != nil || b == nil {
		return nil, err
	}
	chain, err := pki.ParseCertificates(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", st.dir.Path(certdir.FileNextIssuerChain), err)
	}
	return chain, nil
}

// checkNextIssuer checks the new chain as the daemon will, and that the
// device signs with the new key.
func checkNextIssuer(st *state, next []*x509.Certificate, key signer.Signer, c *Ceremony) error {
	if next == nil {
		if cur, err := readOptional(st.dir, certdir.FileIssuerChain); err == nil && cur != nil {
			if chain, err := pki.ParseCertificates(cur); err == nil && pki.KeyMatchesCert(key.Public(), chain[0]) {
				return nil // finished already
			}
		}
		return fmt.Errorf("%s is missing: have the root sign %s (intermediate sign) and put the result there", st.dir.Path(certdir.FileNextIssuerChain), st.dir.Path(certdir.FileNextIssuerCSR))
	}
	if st.ca == nil {
		return errors.New(st.dir.Path(certdir.FileCACert) + " is missing: the cert dir must hold the root")
	}
	roots := append([]*x509.Certificate{st.ca}, st.accepted...)
	if err := pki.CheckIssuerChain(next, roots, key.Public(), c.now()); err != nil {
		return fmt.Errorf("%s would be refused by the daemon: %w", st.dir.Path(certdir.FileNextIssuerChain), err)
	}
	return VerifyDeviceSignature(key, next[0].PublicKey, c.Rand)
}

// planIntermediateFinish: issuer.crt = issuer.next.crt, the rotation's
// files removed after the receipt. nil next means already done.
func planIntermediateFinish(st *state, next []*x509.Certificate, key signer.Description) *plan {
	p := &plan{op: "rotate --intermediate --finish", notes: []string{
		"restart the daemon with TRUSTD_SIGNER set to the new key (roll the pod); a daemon still on the old key refuses the new issuer.crt and keeps serving the old one",
		"once it serves, delete the old intermediate key from the device",
	}}
	if next == nil {
		p.alreadyDone = true
		return p
	}
	p.files = []File{
		{Name: certdir.FileIssuerChain, Data: pki.EncodeCertificates(next...), Mode: 0o644},
		{Name: certdir.FileNextIssuerChain, Remove: true},
		{Name: certdir.FileNextIssuerCSR, Remove: true},
	}
	p.receipt = newReceipt(opIntermediateRotateFinish, key)
	certReceipt(&p.receipt, next[0])
	p.unrecorded = st.receipt(opIntermediateRotateFinish, key.Fingerprint, p.receipt.CertificateFingerprint) != nil
	return p
}
