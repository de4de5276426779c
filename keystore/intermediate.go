package keystore

// The tiered setup: each trustd replica signs with its own intermediate,
// whose key is created on that node's device (IntermediateRequest) and
// certified by the offline root (IntermediateSign). See
// internal/pki.NewIntermediateCertificate for the profile.

import (
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"strings"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// IntermediateRequestOptions configures IntermediateRequest.
type IntermediateRequestOptions struct {
	// SignerURI is where the node's intermediate key is (or is created).
	SignerURI string
	// Algorithm of a new key; empty means ECDSA P-256.
	Algorithm signer.Algorithm
	// Name is the request's CommonName, e.g. the node name.
	Name string
	// ReuseKey makes a request for a key that already exists at SignerURI
	// and that no receipt of this directory vouches for (for example
	// after the ceremony directory was lost). Without it such a key is
	// refused: a key of unknown origin is not certified.
	ReuseKey bool
	// Out receives the PEM certificate request (replaced if present: a
	// request holds nothing secret and can be made again from the key).
	Out Target
	// Authorities, if any, create a TPM key under policy authorities.
	Authorities Authorities
}

// IntermediateRequest creates the node's intermediate key on its device
// (resuming an interrupted run through the intent record, as init does)
// and writes a certificate request signed by that key, for the root's
// holder to sign with IntermediateSign. d is the node's ceremony
// directory (receipts and intent records).
func (c *Ceremony) IntermediateRequest(ctx context.Context, d Dir, o IntermediateRequestOptions) (_ *Outcome, err error) {
	if strings.TrimSpace(o.Name) == "" {
		return nil, errors.New("intermediate request: a name is required (the node name)")
	}
	if o.Algorithm == "" {
		o.Algorithm = signer.ECDSAP256
	}
	if err := replaceableRequest(o.Out); err != nil {
		return nil, fmt.Errorf("intermediate request: %w", err)
	}
	key, pre, err := c.intermediateKey(ctx, d, o)
	if err != nil {
		return nil, fmt.Errorf("intermediate request: %w", err)
	}
	defer closeKey(key, &err)
	der, err := x509.CreateCertificateRequest(c.Rand, &x509.CertificateRequest{Subject: pkix.Name{CommonName: o.Name}}, key)
	if err != nil {
		return nil, fmt.Errorf("intermediate request: sign the request on the device: %w", err)
	}
	// Again now that the key exists: a file key may be where --out points.
	err = replaceableRequest(o.Out)
	var out *Outcome
	if err == nil {
		out, err = c.record(d, planIntermediateRequest(key.Describe(), pki.EncodeCSR(der), o).plan())
	}
	if err != nil {
		return nil, fmt.Errorf("intermediate request: %w", err)
	}
	out.Resumed, out.Written = pre.Resumed, concat(pre.Written, out.Written)
	out.Notes = append(pre.Notes, "take the request to the root's host and run `steward-trustd-ceremony intermediate sign --csr "+o.Out.Dir.Path(o.Out.Name)+" ...`")
	return out, nil
}

// intermediateKey returns the node's key: created (or resumed) under the
// directory's lock, or, with ReuseKey, an existing one; and what was
// done before the request (resumed steps, an approval for the key).
func (c *Ceremony) intermediateKey(ctx context.Context, d Dir, o IntermediateRequestOptions) (signer.Signer, *Outcome, error) {
	st, unlock, err := c.begin(d)
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	key, resumed, err := c.createKey(ctx, st, keyRequest{op: opIntermediateKey, uri: o.SignerURI, alg: o.Algorithm, authorities: o.Authorities})
	var foreign *ForeignKeyError
	switch {
	case errors.As(err, &foreign) && o.ReuseKey:
		key, err = c.Keys.Open(ctx, o.SignerURI)
		resumed = []string{fmt.Sprintf("key %s (%s) existed and is reused as asked", foreign.Fingerprint, foreign.Location)}
	case errors.As(err, &foreign):
		err = fmt.Errorf("%w; if this is the node's intermediate key, re-run with --reuse-key", err)
	}
	return key, &Outcome{Resumed: concat(st.cleaned, st.earlier.Resumed, resumed), Written: st.earlier.Written, Notes: st.earlier.Notes}, err
}

// replaceableRequest checks that the request's output is absent or holds
// only certificate requests: a request can be made again and is replaced
// without asking, but a key or certificate at that path (a mistyped
// --out, or --out naming the file key itself) must never be.
func replaceableRequest(t Target) error {
	return replaceable(t, "a certificate request", isPEMRequest)
}

// replaceable checks that t is absent or holds what is (a file the
// operation may replace without an explicit flag).
func replaceable(t Target, what string, is func([]byte) bool) error {
	b, err := readOptional(t.Dir, t.Name)
	if err != nil || b == nil || is(b) {
		return err
	}
	return fmt.Errorf("refusing to replace %s: it exists and is not %s (%w); give --out a new file", t.Dir.Path(t.Name), what, fs.ErrExist)
}

// isPEMRequest reports whether b is PEM certificate requests only.
func isPEMRequest(b []byte) bool {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil || block.Type != "CERTIFICATE REQUEST" && block.Type != "NEW CERTIFICATE REQUEST" {
			return false
		}
		if len(bytes.TrimSpace(b)) == 0 {
			return true
		}
	}
}

// planIntermediateRequest is the request's output and receipt content.
func planIntermediateRequest(key signer.Description, csrPEM []byte, o IntermediateRequestOptions) issuance {
	return issuance{
		op: opIntermediateRequest, key: key, details: map[string]string{"name": o.Name},
		outputs: []placement{{Dir: o.Out.Dir, File: File{Name: o.Out.Name, Data: csrPEM, Mode: 0o644}, Overwrite: true}},
	}
}

// IntermediateSignOptions configures IntermediateSign.
type IntermediateSignOptions struct {
	// SignerURI and CA are the root.
	SignerURI string
	CA        *x509.Certificate
	// CSR is the node's PEM request (its signature is verified).
	CSR []byte
	// Validity; zero means pki.DefaultIntermediateValidity. Never beyond
	// the root's.
	Validity time.Duration
	// PermittedIPRanges become IP name constraints (the worker ranges).
	PermittedIPRanges []*net.IPNet
	// Out receives issuer.crt: the intermediate alone (the root is
	// os-ca.crt and stays out of the chain).
	Out Target
	// Force allows replacing Out.
	Force bool
	// Rotation says the request is a rotation's (rotate --intermediate
	// wrote it as issuer.next.csr); an Out named issuer.next.crt says so
	// too. It changes only what the operator is told to do next.
	Rotation bool
}

// IntermediateSign certifies a node's intermediate key with the root:
// pki.NewIntermediateCertificate's profile, subject = the request's
// CommonName. The result is checked as the daemon checks issuer.crt
// before it is written.
func (c *Ceremony) IntermediateSign(ctx context.Context, receipts Dir, o IntermediateSignOptions) (*x509.Certificate, *Outcome, error) {
	cert, root, err := c.signIntermediate(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	is := planIntermediateSign(root, cert, o)
	is.details["attestation"] = "not attested: no evidence that the key is in a TPM (intermediate sign --ek-roots verifies an attested request)"
	out, err := c.record(receipts, is.plan())
	if err != nil {
		return nil, nil, fmt.Errorf("intermediate sign: %w", err)
	}
	out.Notes = []string{intermediateSignNext(o)}
	return cert, out, nil
}

// intermediateSignNext tells where the signed intermediate goes: a first
// enrolment's becomes issuer.crt (hot-reloaded); a rotation's must not,
// since the daemon still signs with the old key and would refuse it.
func intermediateSignNext(o IntermediateSignOptions) string {
	out := o.Out.Dir.Path(o.Out.Name)
	if o.Rotation || o.Out.Name == certdir.FileNextIssuerChain {
		return "a rotation's intermediate: put " + out + " into the node's cert dir as " + certdir.FileNextIssuerChain +
			" (not " + certdir.FileIssuerChain + ": the daemon still signs with the old key and would refuse it), then on the node run: " +
			"steward-trustd-ceremony rotate --intermediate --finish --new-signer NEW_URI --out CERTDIR, and restart the daemon on the new key"
	}
	return "put " + out + " into the node's cert dir as " + certdir.FileIssuerChain + " (or $TRUSTD_ISSUER_CRT); the daemon reloads it"
}

// signIntermediate has the root certify o.CSR's key and checks the
// result as the daemon checks issuer.crt; nothing is written.
func (c *Ceremony) signIntermediate(ctx context.Context, o IntermediateSignOptions) (_ *x509.Certificate, _ signer.Description, err error) {
	if err := c.check(); err != nil {
		return nil, signer.Description{}, err
	}
	csr, err := pki.ParseCSR(o.CSR, 0)
	if err != nil {
		return nil, signer.Description{}, fmt.Errorf("intermediate sign: %w", err)
	}
	s, err := c.OpenCA(ctx, o.SignerURI, o.CA)
	if err != nil {
		return nil, signer.Description{}, fmt.Errorf("intermediate sign: %w", err)
	}
	defer closeKey(s, &err)
	profile := pki.IntermediateOptions{Subject: pkix.Name{CommonName: csr.Subject.CommonName}, Validity: o.Validity, PermittedIPRanges: o.PermittedIPRanges}
	cert, err := pki.NewIntermediateCertificate(o.CA, s, csr.PublicKey, profile, c.now(), c.Rand)
	if err == nil {
		err = pki.CheckIssuerChain([]*x509.Certificate{cert}, []*x509.Certificate{o.CA}, csr.PublicKey, c.now())
	}
	if err != nil {
		return nil, signer.Description{}, fmt.Errorf("intermediate sign: %w", err)
	}
	return cert, s.Describe(), nil
}

// planIntermediateSign is the signing's output and receipt content.
func planIntermediateSign(root signer.Description, cert *x509.Certificate, o IntermediateSignOptions) issuance {
	var ranges []string
	for _, n := range o.PermittedIPRanges {
		ranges = append(ranges, n.String())
	}
	return issuance{
		op: opIntermediateSign, key: root, cert: cert,
		details: map[string]string{"caFingerprint": pki.CertFingerprint(o.CA), "permittedIPRanges": strings.Join(ranges, ","), "eku": pki.DescribeEKU(cert)},
		outputs: []placement{{Dir: o.Out.Dir, File: File{Name: o.Out.Name, Data: pki.EncodeCertificates(cert), Mode: 0o644}, Overwrite: o.Force}},
	}
}
