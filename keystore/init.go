package keystore

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// InitOptions configures Init.
type InitOptions struct {
	// SignerURI is where the new key is created (tpm:, pkcs11: or file:).
	SignerURI string
	// Cluster names the CA (CommonName) and the Kubernetes Secret.
	Cluster string
	// Organization is the CA subject's O; empty means "talos".
	Organization string
	// Validity of the CA; zero means pki.DefaultCAValidity.
	Validity time.Duration
	// Algorithm of the new key; empty means signer.ECDSAP256.
	Algorithm signer.Algorithm
	// Force allows replacing existing output files (never device keys).
	Force bool
	// Authorities, if any, create a TPM key under policy authorities.
	Authorities Authorities
}

// initOutputs are the files init writes besides its receipt.
var initOutputs = []string{certdir.FileCACert, certdir.FileToken, certdir.FileWorkerPatch, certdir.FileKubernetesSecret}

// Init creates the OS CA key on the device, self-signs the CA certificate
// through it (the signature is verified) and writes os-ca.crt, token,
// kubernetes-secret.yaml (no private key) and the worker machine-config
// patch into d, with a receipt.
//
// An interrupted Init resumes when re-run with the same flags: the key is
// recognised by its "init.key" receipt, or, if the run was killed between
// creating the key and recording it, by the intent record written before
// it was created; an os-ca.crt of that key is kept, as is its token; a
// complete earlier run is reported as AlreadyDone and nothing is written.
// A key the directory has no record of is refused (ForeignKeyError).
func (c *Ceremony) Init(ctx context.Context, d Dir, o InitOptions) (_ *Outcome, err error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	st, unlock, err := c.begin(d)
	if err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	defer unlock()
	key, resumed, err := c.initKey(ctx, st, o)
	if err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	defer closeKey(key, &err)
	ca := reusableCA(st, key.Public())
	if ca == nil {
		if ca, err = c.initCA(st, key, o); err != nil {
			return nil, fmt.Errorf("init: %w", err)
		}
	}
	token, err := certdir.NewToken(c.Rand)
	if err != nil {
		return nil, err
	}
	p, err := planInit(st, o, initResults{key: key.Describe(), keyResumed: resumed, ca: ca, newToken: token})
	if err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	return c.commit(st, p)
}

func (o *InitOptions) check() error {
	if o.Cluster == "" {
		return errors.New("init: a cluster name is required")
	}
	if o.Validity < 0 {
		return errors.New("init: validity must be positive")
	}
	if o.Algorithm == "" {
		o.Algorithm = signer.ECDSAP256
	}
	return nil
}

// initKey creates or resumes the key. A directory that already holds
// init outputs is only resumed, unless --force: no key is created for a
// directory init would then refuse to write.
func (c *Ceremony) initKey(ctx context.Context, st *state, o InitOptions) (signer.Signer, []string, error) {
	resumeOnly := !o.Force && st.has(initOutputs...)
	key, resumed, err := c.createKey(ctx, st, keyRequest{op: opInitKey, uri: o.SignerURI, alg: o.Algorithm, resumeOnly: resumeOnly, authorities: o.Authorities})
	if errors.Is(err, errNothingToResume) {
		return nil, nil, fmt.Errorf("%w: %s holds the files of another init (no key at the signer URI was created for them); use another --out, or --force", ErrExists, st.dir.Path(""))
	}
	return key, resumed, err
}

// reusableCA returns os-ca.crt if it is the CA of pub (an earlier run
// issued it).
func reusableCA(st *state, pub crypto.PublicKey) *x509.Certificate {
	if st.ca != nil && pki.KeyMatchesCert(pub, st.ca) {
		return st.ca
	}
	return nil
}

// initCA self-signs a new CA through the device, unless os-ca.crt holds
// another CA and --force was not given.
func (c *Ceremony) initCA(st *state, key signer.Signer, o InitOptions) (*x509.Certificate, error) {
	if !o.Force && (st.ca != nil || st.caErr != nil) {
		return nil, fmt.Errorf("%w: %s holds a CA that is not the key's; remove it or pass --force", ErrExists, st.dir.Path(certdir.FileCACert))
	}
	ca, err := pki.NewCACertificate(key, pki.CAOptions{Cluster: o.Cluster, Organization: o.Organization, Validity: o.Validity}, c.now(), c.Rand)
	if err != nil {
		return nil, fmt.Errorf("self-sign the CA through the device: %w", err)
	}
	c.step("init CA signed")
	return ca, nil
}

// initResults is what the device produced for Init.
type initResults struct {
	key        signer.Description
	keyResumed []string
	// ca is the CA of the key (issued now or by an earlier run).
	ca *x509.Certificate
	// newToken is used unless an earlier run's token is kept.
	newToken string
}

// planInit decides Init's files and receipt from the state alone: an
// earlier run's token is kept when its CA is, a complete earlier run is
// already done, and a fresh run refuses to replace files without --force.
func planInit(st *state, o InitOptions, r initResults) (*plan, error) {
	p := &plan{op: string(opInit), resumed: r.keyResumed}
	keptCA := st.ca != nil && st.ca.Equal(r.ca)
	resuming := len(r.keyResumed) > 0 || keptCA
	if keptCA {
		p.resumed = append(p.resumed, st.dir.Path(certdir.FileCACert)+" was already issued for this key")
	}
	token := r.newToken
	if resuming && st.token != "" {
		token = st.token
		p.resumed = append(p.resumed, st.dir.Path(certdir.FileToken)+" kept")
	}
	files, err := clusterFiles(o.Cluster, r.ca, nil, token, nil, nil)
	if err != nil {
		return nil, err
	}
	if resuming && !o.Force && st.matches(files) && st.receipt(opInit, r.key.Fingerprint, pki.CertFingerprint(r.ca)) != nil {
		p.alreadyDone = true
		return p, nil
	}
	if present := st.present(files); !o.Force && !resuming && len(present) > 0 {
		return nil, fmt.Errorf("%w: %v", ErrExists, present)
	}
	p.files = files
	p.receipt = newReceipt(opInit, r.key)
	certReceipt(&p.receipt, r.ca)
	p.notes = []string{
		"apply " + st.dir.Path(certdir.FileWorkerPatch) + " to every worker's machine config (it holds the token: keep it secret)",
		"deploy " + st.dir.Path(certdir.FileKubernetesSecret) + " and run steward-trustd with TRUSTD_SIGNER set to the signer URI",
	}
	return p, nil
}
