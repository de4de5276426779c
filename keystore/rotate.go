package keystore

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// RotateOptions configures Rotate.
type RotateOptions struct {
	// SignerURI is the current CA's (the root's) key: it signs the trust
	// statement that vouches for the new CA, without which the daemon
	// does not serve it.
	SignerURI string
	// NewSignerURI is where the new CA key is created.
	NewSignerURI string
	// Algorithm of the new key; empty means signer.ECDSAP256.
	Algorithm signer.Algorithm
	// Validity of the new CA; zero means pki.DefaultCAValidity.
	Validity time.Duration
	// Authorities, if any, create the new TPM key under policy
	// authorities.
	Authorities Authorities
}

// Rotate starts a CA rotation in the ceremony directory d: it creates a
// new key on the device, self-signs a new CA with the current CA's subject
// into os-ca.next.crt and adds it to accepted-cas.crt. os-ca.crt stays the
// issuing CA, so the daemon keeps signing with the old key and every
// existing worker and talosctl keeps working, while the `ca` bundle the
// daemon returns (os-ca.crt + accepted-cas.crt) now also lets in talosctl
// certificates signed by the new CA. The worker patch gains
// machine.acceptedCAs with the new CA. Finish with RotateFinish.
//
// An interrupted Rotate resumes as Init does (rotate.key receipt or
// intent record); a rotation in progress continues only with its key.
func (c *Ceremony) Rotate(ctx context.Context, d Dir, o RotateOptions) (*Outcome, error) {
	if o.Algorithm == "" {
		o.Algorithm = signer.ECDSAP256
	}
	st, unlock, err := c.begin(d)
	if err != nil {
		return nil, fmt.Errorf("rotate: %w", err)
	}
	defer unlock()
	cur, _, err := st.currentCA()
	if err != nil {
		return nil, fmt.Errorf("rotate: %w", err)
	}
	// The current root first: without it nothing is created.
	if err := c.vouchAs(ctx, st, o.SignerURI, cur, nil); err != nil {
		return nil, fmt.Errorf("rotate: %w", err)
	}
	key, next, resumed, err := c.rotateNew(ctx, st, o, cur)
	if err != nil {
		return nil, fmt.Errorf("rotate: %w", err)
	}
	var statement vouched
	accepted := certdir.Unique(append(without(st.accepted, cur), next)...)
	if err := c.vouchAs(ctx, st, o.SignerURI, cur, func(root signer.Signer) (err error) {
		statement, err = c.vouch(st, root, cur, accepted)
		return err
	}); err != nil {
		return nil, fmt.Errorf("rotate: %w", err)
	}
	p, err := planRotate(st, key, resumed, next, statement)
	if err != nil {
		return nil, fmt.Errorf("rotate: %w", err)
	}
	return c.commit(st, p)
}

// vouchAs opens the current root's key at uri and runs use with it (nil:
// only checks that it opens), closing it before it returns. Its own
// session: on a TPM without a resource manager, creating the new key
// flushes what other connections left loaded.
func (c *Ceremony) vouchAs(ctx context.Context, st *state, uri string, cur *x509.Certificate, use func(signer.Signer) error) (err error) {
	root, err := c.OpenCA(ctx, uri, cur)
	if err != nil {
		return fmt.Errorf("the current CA's key (--signer) vouches for the new CA: %w", err)
	}
	defer closeKey(root, &err)
	if use == nil {
		return nil
	}
	return use(root)
}

// rotateNew creates or resumes the new key and its CA (os-ca.next.crt
// if an earlier run issued it), and closes the key.
func (c *Ceremony) rotateNew(ctx context.Context, st *state, o RotateOptions, cur *x509.Certificate) (_ signer.Description, _ *x509.Certificate, _ []string, err error) {
	key, resumed, err := c.rotateKey(ctx, st, o, cur)
	if err != nil {
		return signer.Description{}, nil, nil, err
	}
	defer closeKey(key, &err)
	next := st.next
	if next == nil {
		if next, err = c.rotateCA(key, cur, o); err != nil {
			return signer.Description{}, nil, nil, err
		}
	}
	return key.Describe(), next, resumed, nil
}

// rotateKey creates or resumes the new key. With os-ca.next.crt present
// only that rotation's key may continue it.
func (c *Ceremony) rotateKey(ctx context.Context, st *state, o RotateOptions, cur *x509.Certificate) (signer.Signer, []string, error) {
	key, resumed, err := c.createKey(ctx, st, keyRequest{op: opRotateKey, uri: o.NewSignerURI, alg: o.Algorithm, resumeOnly: st.next != nil, authorities: o.Authorities})
	inProgress := func() error {
		return fmt.Errorf("a rotation to CA %s is already in progress (%s) with another key; re-run with its --new-signer, or finish it with `rotate --finish` first", pki.CertFingerprint(st.next), st.dir.Path(certdir.FileNextCACert))
	}
	switch {
	case errors.Is(err, errNothingToResume):
		return nil, nil, inProgress()
	case err != nil:
		return nil, nil, err
	case st.next != nil && !pki.KeyMatchesCert(key.Public(), st.next):
		return nil, nil, errors.Join(inProgress(), key.Close())
	case pki.KeyMatchesCert(key.Public(), cur):
		return nil, nil, errors.Join(fmt.Errorf("%w: the key at --new-signer is the current CA's key; a rotation needs a new key location", signer.ErrKeyExists), key.Close())
	}
	return key, resumed, nil
}

// rotateCA self-signs the new CA, with the current CA's subject.
func (c *Ceremony) rotateCA(key signer.Signer, cur *x509.Certificate, o RotateOptions) (*x509.Certificate, error) {
	org := "talos"
	if len(cur.Subject.Organization) > 0 {
		org = cur.Subject.Organization[0]
	}
	next, err := pki.NewCACertificate(key, pki.CAOptions{Cluster: cur.Subject.CommonName, Organization: org, Validity: o.Validity}, c.now(), c.Rand)
	if err != nil {
		return nil, fmt.Errorf("self-sign the new CA through the device: %w", err)
	}
	c.step("rotate CA signed")
	return next, nil
}

// planRotate decides the files of a rotation start: os-ca.next.crt first
// (a re-run recognises the rotation by it), then the cluster files with
// the new CA accepted.
func planRotate(st *state, key signer.Description, resumed []string, next *x509.Certificate, statement vouched) (*plan, error) {
	cur, token, err := st.currentCA()
	if err != nil {
		return nil, err
	}
	p := &plan{op: string(opRotate), resumed: resumed}
	if st.next != nil {
		p.resumed = append(p.resumed, st.dir.Path(certdir.FileNextCACert)+" was already issued")
	}
	accepted := certdir.Unique(append(without(st.accepted, cur), next)...)
	files, err := clusterFiles(secretCluster(cur), cur, accepted, token, st.serverFiles(), statement.data)
	if err != nil {
		return nil, err
	}
	files = append([]File{{Name: certdir.FileNextCACert, Data: pki.EncodeCertificates(next), Mode: 0o644}}, files...)
	if st.matches(files) && st.receipt(opRotate, key.Fingerprint, pki.CertFingerprint(next)) != nil {
		p.alreadyDone = true
		return p, nil
	}
	p.files = files
	p.receipt = newReceipt(opRotate, key)
	certReceipt(&p.receipt, next)
	p.receipt.Details = map[string]string{"currentCAFingerprint": pki.CertFingerprint(cur), "statementSequence": strconv.FormatUint(statement.seq, 10)}
	d := st.dir
	p.notes = []string{
		"1. deploy the updated " + d.Path(certdir.FileKubernetesSecret) + " (or copy " + certdir.FileAcceptedCAs + " and " + certdir.FileTrustStatement + ", the old root's statement vouching for the new CA, into the daemon's cert dir): it reloads them and still signs with the old key",
		"2. apply " + d.Path(certdir.FileWorkerPatch) + " to every worker (adds machine.acceptedCAs); workers pick up the new client-CA bundle at their next certificate renewal (12 h, or on reboot)",
		"3. issue new talosconfigs with --signer <new key URI> --ca " + d.Path(certdir.FileNextCACert) + "; they trust both CAs",
		"4. when every worker and user has moved, run `rotate --finish`",
	}
	return p, nil
}

// RotateFinishOptions configures RotateFinish.
type RotateFinishOptions struct {
	// NewSignerURI is the key of os-ca.next.crt.
	NewSignerURI string
	// ServerValidity of the re-issued serving certificate.
	ServerValidity time.Duration
}

// RotateFinish ends a rotation: os-ca.next.crt becomes os-ca.crt, the old
// CA leaves accepted-cas.crt (and with it the `ca` bundle, so old-CA
// talosctl certificates stop working), server.crt is re-issued by the new
// CA for the same names if present, and the worker patch drops the old CA.
// os-ca.next.crt is removed last, after the receipt: a re-run after a
// crash finds it and completes the finish. Without a rotation in progress
// the error wraps ErrNoRotation.
func (c *Ceremony) RotateFinish(ctx context.Context, d Dir, o RotateFinishOptions) (_ *Outcome, err error) {
	st, unlock, err := c.begin(d)
	if err != nil {
		return nil, fmt.Errorf("rotate --finish: %w", err)
	}
	defer unlock()
	f, err := finishing(st)
	if err != nil {
		return nil, fmt.Errorf("rotate --finish: %w", err)
	}
	key, err := c.OpenCA(ctx, o.NewSignerURI, f.next)
	if err != nil {
		return nil, fmt.Errorf("rotate --finish: %w", err)
	}
	defer closeKey(key, &err)
	if err := VerifyDeviceSignature(key, f.next.PublicKey, c.Rand); err != nil {
		return nil, fmt.Errorf("rotate --finish: %w", err)
	}
	server, err := c.finishServer(st, f, key, o.ServerValidity)
	if err != nil {
		return nil, fmt.Errorf("rotate --finish: %w", err)
	}
	statement, err := c.finishStatement(st, f, key)
	if err != nil {
		return nil, fmt.Errorf("rotate --finish: %w", err)
	}
	p, err := planFinish(st, f, key.Describe(), server, statement)
	if err != nil {
		return nil, fmt.Errorf("rotate --finish: %w", err)
	}
	return c.commit(st, p)
}

// finish is where a rotation's finish stands.
type finish struct {
	// next is the new CA.
	next *x509.Certificate
	// retired is the old CA's fingerprint ("" if unknown).
	retired string
	// switched: os-ca.crt is already the new CA (an interrupted finish).
	switched bool
	// done: a finish completed (no os-ca.next.crt, a receipt for the CA).
	done bool
}

// finishing reads where a finish stands from the state.
func finishing(st *state) (*finish, error) {
	if st.next == nil {
		if st.ca != nil && st.receipt(opRotateDone, "", pki.CertFingerprint(st.ca)) != nil {
			return &finish{next: st.ca, switched: true, done: true}, nil
		}
		return nil, fmt.Errorf("%w (%s is missing)", ErrNoRotation, st.dir.Path(certdir.FileNextCACert))
	}
	cur, _, err := st.currentCA()
	if err != nil {
		return nil, err
	}
	f := &finish{next: st.next, retired: pki.CertFingerprint(cur), switched: cur.Equal(st.next)}
	if f.switched {
		f.retired = ""
		if r := st.receipt(opRotate, "", pki.CertFingerprint(st.next)); r != nil {
			f.retired = r.Details["currentCAFingerprint"]
		}
	}
	return f, nil
}

// finishServer returns server.crt and server.key issued by the new CA:
// kept if an interrupted finish re-issued them already, re-issued through
// the device for the same names otherwise; nil without a serving
// certificate.
func (c *Ceremony) finishServer(st *state, f *finish, key signer.Signer, validity time.Duration) (map[string][]byte, error) {
	server := st.serverFiles()
	if server == nil || f.done {
		return server, nil
	}
	prev, err := pki.ParseCertificate(server[certdir.FileServerCert])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", st.dir.Path(certdir.FileServerCert), err)
	}
	if prev.CheckSignatureFrom(f.next) == nil {
		return server, nil
	}
	hosts := append([]string{}, prev.DNSNames...)
	for _, ip := range prev.IPAddresses {
		hosts = append(hosts, ip.String())
	}
	crt, keyPEM, err := issueServing(f.next, key, hosts, validity, c.now(), c.Rand)
	if err != nil {
		return nil, fmt.Errorf("re-issue %s: %w", certdir.FileServerCert, err)
	}
	c.step("rotate --finish server certificate issued")
	return map[string][]byte{certdir.FileServerCert: pki.EncodeCertificates(crt), certdir.FileServerKey: keyPEM}, nil
}

// planFinish decides the files of a finish: the serving certificate, the
// cluster files of the new CA, the receipt, then the removal of
// os-ca.next.crt.
func planFinish(st *state, f *finish, key signer.Description, server map[string][]byte, statement vouched) (*plan, error) {
	p := &plan{op: "rotate --finish"}
	if f.done {
		p.alreadyDone = true
		return p, nil
	}
	_, token, err := st.currentCA()
	if err != nil {
		return nil, err
	}
	var files []File
	if server != nil {
		files = []File{
			{Name: certdir.FileServerKey, Data: server[certdir.FileServerKey], Mode: 0o600},
			{Name: certdir.FileServerCert, Data: server[certdir.FileServerCert], Mode: 0o600},
		}
	}
	cluster, err := clusterFiles(secretCluster(f.next), f.next, finishAccepted(st, f), token, server, statement.data)
	if err != nil {
		return nil, err
	}
	files = append(append(files, cluster...), File{Name: certdir.FileNextCACert, Remove: true})
	if f.switched && st.receipt(opRotateDone, key.Fingerprint, pki.CertFingerprint(f.next)) != nil {
		// The earlier run was killed after its receipt: only the
		// removals are left.
		p.resumed = []string{"the finish was recorded by an earlier run; the files it removes are removed now"}
		files = removals(files)
		p.unrecorded = true
	}
	p.files = files
	p.receipt = newReceipt(opRotateDone, key)
	certReceipt(&p.receipt, f.next)
	p.receipt.Details = map[string]string{"retiredCAFingerprint": f.retired}
	d := st.dir
	p.notes = []string{
		"restart steward-trustd with TRUSTD_SIGNER set to the new key URI and the updated " + d.Path(certdir.FileKubernetesSecret),
		"apply " + d.Path(certdir.FileWorkerPatch) + " to every worker (machine.ca is now the new CA)",
		"talosconfigs signed by the old CA stop working once workers renew their certificates; the old key can then be destroyed on the device",
	}
	return p, nil
}

// finishAccepted is accepted-cas.crt after a finish: without either root.
func finishAccepted(st *state, f *finish) []*x509.Certificate {
	return without(st.accepted, st.ca, f.next)
}

// finishStatement is the new root's statement for the CAs still accepted
// after the finish, numbered after the old root's, so that the daemon
// (which only takes the new root because the old one vouched for it)
// keeps refusing every older statement.
func (c *Ceremony) finishStatement(st *state, f *finish, key signer.Signer) (vouched, error) {
	if f.done {
		return vouched{}, nil
	}
	return c.vouch(st, key, f.next, finishAccepted(st, f))
}

// removals returns the removals of files.
func removals(files []File) []File {
	var out []File
	for _, f := range files {
		if f.Remove {
			out = append(out, f)
		}
	}
	return out
}

func secretCluster(ca *x509.Certificate) string {
	if ca.Subject.CommonName != "" {
		return ca.Subject.CommonName
	}
	return "talos"
}
