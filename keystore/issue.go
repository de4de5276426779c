package keystore

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	talosx509 "github.com/siderolabs/crypto/x509"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/keyutil"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// Target is one output file.
type Target struct {
	Dir  Dir
	Name string
}

// OpenCA opens the key at uri and checks that it is ca's key and that ca
// is a CA certificate.
func (c *Ceremony) OpenCA(ctx context.Context, uri string, ca *x509.Certificate) (signer.Signer, error) {
	if err := pki.CheckCA(ca); err != nil {
		return nil, err
	}
	s, err := c.Keys.Open(ctx, uri)
	if err != nil {
		return nil, fmt.Errorf("open CA key: %w", err)
	}
	if !pki.KeyMatchesCert(s.Public(), ca) {
		fp, _ := signer.Fingerprint(ca.PublicKey)
		err := fmt.Errorf("%w: the key at the signer URI (fingerprint %s) is not the key of CA %q (fingerprint %s); after rotate --finish, %s is the new CA: give --signer the new key's URI (during a rotation the new CA is %s)",
			ErrKeyMismatch, s.Describe().Fingerprint, ca.Subject, fp, certdir.FileCACert, certdir.FileNextCACert)
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

// issuance is what an issuing operation made through the device: the
// certificate, the files that carry it and what its receipt records
// besides the certificate.
type issuance struct {
	op      Operation
	key     signer.Description
	cert    *x509.Certificate
	details map[string]string
	outputs []placement
}

// plan is the pure half of an issuing operation: the outputs and the
// receipt that records them.
func (is issuance) plan() *plan {
	r := newReceipt(is.op, is.key)
	if is.cert != nil { // a request (intermediate request) has none yet
		certReceipt(&r, is.cert)
	}
	r.Details = is.details
	return &plan{receipt: r, outputs: is.outputs}
}

// SignCSROptions configures SignCSR.
type SignCSROptions struct {
	// SignerURI and CA are the issuing CA.
	SignerURI string
	CA        *x509.Certificate
	// CSR is the PEM certificate request (its signature is verified).
	CSR []byte
	// Roles become the certificate's Organization (see pki.ParseRoles).
	Roles []string
	// Validity; zero means pki.DefaultClientValidity.
	Validity time.Duration
	// Out receives the PEM certificate.
	Out Target
	// Force allows replacing Out.
	Force bool
}

// SignCSR issues a talosctl client certificate for a CSR: Organization =
// roles, EKU exactly ClientAuth, KeyUsage DigitalSignature. Nothing but
// the CSR's public key and CommonName is taken from the request.
func (c *Ceremony) SignCSR(ctx context.Context, receipts Dir, o SignCSROptions) (_ *x509.Certificate, _ *Outcome, err error) {
	if err := c.check(); err != nil {
		return nil, nil, err
	}
	roles, err := pki.ParseRoles(o.Roles)
	if err != nil {
		return nil, nil, fmt.Errorf("sign-csr: %w", err)
	}
	csr, err := pki.ParseCSR(o.CSR, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("sign-csr: %w", err)
	}
	s, err := c.OpenCA(ctx, o.SignerURI, o.CA)
	if err != nil {
		return nil, nil, fmt.Errorf("sign-csr: %w", err)
	}
	defer closeKey(s, &err)
	cert, err := pki.NewClientCertificate(o.CA, s, csr.PublicKey, csr.Subject.CommonName, roles, o.Validity, c.now(), c.Rand)
	if err != nil {
		return nil, nil, fmt.Errorf("sign-csr: %w", err)
	}
	out, err := c.record(receipts, issuance{
		op: opSignCSR, key: s.Describe(), cert: cert,
		details: map[string]string{"roles": strings.Join(roles, ","), "caFingerprint": pki.CertFingerprint(o.CA)},
		outputs: []placement{{Dir: o.Out.Dir, File: File{Name: o.Out.Name, Data: pki.EncodeCertificates(cert), Mode: 0o644}, Overwrite: o.Force}},
	}.plan())
	if err != nil {
		return nil, nil, fmt.Errorf("sign-csr: %w", err)
	}
	out.Notes = append(out.Notes, clientCANotes(o.CA)...)
	return cert, out, nil
}

// clientCANotes warns when the issuing CA cannot vouch for talosctl
// certificates (a tiered setup's ServerAuth-only intermediate): Go checks
// EKU down the whole chain, so apid refuses them.
func clientCANotes(ca *x509.Certificate) []string {
	if err := pki.CheckClientCA(ca); err != nil {
		return []string{"warning: " + err.Error() + "; issue talosctl certificates with the root (os-ca.crt) and its key"}
	}
	return nil
}

// TalosconfigOptions configures Talosconfig.
type TalosconfigOptions struct {
	// SignerURI and CA are the issuing CA.
	SignerURI string
	CA        *x509.Certificate
	// Trust is the `ca` bundle talosctl verifies apid's server certificate
	// with; empty means CA only. During a rotation it must hold the old
	// and the new CA.
	Trust []*x509.Certificate
	// Context names the talosconfig context.
	Context string
	// Endpoints are the Talos API endpoints (IPs or names); the nodes
	// default to the same list (a hosted control plane does not forward).
	Endpoints []string
	// Nodes overrides the default nodes.
	Nodes []string
	// Roles, CommonName and Validity of the client certificate.
	Roles      []string
	CommonName string
	Validity   time.Duration
	// Out receives the talosconfig, mode 0600.
	Out Target
	// Force allows replacing Out.
	Force bool
}

// Talosconfig generates a client key locally, has the device sign its
// certificate (as SignCSR) and writes a talosconfig in the format of
// github.com/siderolabs/talos/pkg/machinery/client/config.
func (c *Ceremony) Talosconfig(ctx context.Context, receipts Dir, o TalosconfigOptions) (_ *Outcome, err error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if o.Context == "" {
		return nil, errors.New("talosconfig: a context name is required")
	}
	if len(o.Endpoints) == 0 {
		return nil, errors.New("talosconfig: at least one endpoint is required")
	}
	if _, _, err := pki.SplitHosts(o.Endpoints); err != nil {
		return nil, fmt.Errorf("talosconfig: endpoint: %w", err)
	}
	roles, err := pki.ParseRoles(o.Roles)
	if err != nil {
		return nil, fmt.Errorf("talosconfig: %w", err)
	}
	s, err := c.OpenCA(ctx, o.SignerURI, o.CA)
	if err != nil {
		return nil, fmt.Errorf("talosconfig: %w", err)
	}
	defer closeKey(s, &err)
	key, err := keyutil.GenerateKey(c.Rand, signer.ECDSAP256)
	if err != nil {
		return nil, fmt.Errorf("talosconfig: generate client key: %w", err)
	}
	cert, err := pki.NewClientCertificate(o.CA, s, key.Public(), o.CommonName, roles, o.Validity, c.now(), c.Rand)
	if err != nil {
		return nil, fmt.Errorf("talosconfig: %w", err)
	}
	keyPEM, err := keyutil.MarshalPrivateKeyPEM(key)
	if err != nil {
		return nil, err
	}
	data, err := talosconfigFile(o, cert, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("talosconfig: %w", err)
	}
	out, err := c.record(receipts, issuance{
		op: opTalosconfig, key: s.Describe(), cert: cert,
		details: map[string]string{"roles": strings.Join(roles, ","), "context": o.Context, "endpoints": strings.Join(o.Endpoints, ","), "caFingerprint": pki.CertFingerprint(o.CA)},
		outputs: []placement{{Dir: o.Out.Dir, File: File{Name: o.Out.Name, Data: data, Mode: 0o600}, Overwrite: o.Force}},
	}.plan())
	if err != nil {
		return nil, fmt.Errorf("talosconfig: %w", err)
	}
	out.Notes = append(out.Notes, clientCANotes(o.CA)...)
	return out, nil
}

// talosconfigFile renders the talosconfig for cert and its key: the
// trust bundle (o.Trust, or the CA alone) as `ca`, the endpoints, and the
// nodes (the endpoints unless o.Nodes says otherwise).
func talosconfigFile(o TalosconfigOptions, cert *x509.Certificate, keyPEM []byte) ([]byte, error) {
	trust := o.Trust
	if len(trust) == 0 {
		trust = []*x509.Certificate{o.CA}
	}
	cfg := clientconfig.NewConfig(o.Context, o.Endpoints, pki.EncodeCertificates(certdir.Unique(trust...)...),
		&talosx509.PEMEncodedCertificateAndKey{Crt: pki.EncodeCertificates(cert), Key: keyPEM})
	nodes := o.Nodes
	if len(nodes) == 0 {
		nodes = o.Endpoints
	}
	cfg.Contexts[o.Context].Nodes = nodes
	data, err := cfg.Bytes()
	if err != nil {
		return nil, fmt.Errorf("marshal: %w", err)
	}
	return data, nil
}

// ServerCertOptions configures ServerCert.
type ServerCertOptions struct {
	// SignerURI and CA are the issuing CA.
	SignerURI string
	CA        *x509.Certificate
	// Hosts are the IP addresses and DNS names workers dial.
	Hosts []string
	// Validity; zero means pki.DefaultServingValidity.
	Validity time.Duration
	// Out is the directory for server.crt and server.key.
	Out Dir
	// Force allows replacing them.
	Force bool
}

// ServerCert issues trustd's serving certificate for the given hosts,
// with a locally generated P-256 key, into server.crt and server.key.
func (c *Ceremony) ServerCert(ctx context.Context, receipts Dir, o ServerCertOptions) (_ *x509.Certificate, _ *Outcome, err error) {
	if err := c.check(); err != nil {
		return nil, nil, err
	}
	if len(o.Hosts) == 0 {
		return nil, nil, errors.New("server-cert: at least one --san is required")
	}
	if _, _, err := pki.SplitHosts(o.Hosts); err != nil {
		return nil, nil, fmt.Errorf("server-cert: %w", err)
	}
	if !o.Force {
		if err := checkAbsent(o.Out, []File{{Name: certdir.FileServerCert}, {Name: certdir.FileServerKey}}); err != nil {
			return nil, nil, fmt.Errorf("server-cert: %w", err)
		}
	}
	s, err := c.OpenCA(ctx, o.SignerURI, o.CA)
	if err != nil {
		return nil, nil, fmt.Errorf("server-cert: %w", err)
	}
	defer closeKey(s, &err)
	cert, keyPEM, err := issueServing(o.CA, s, o.Hosts, o.Validity, c.now(), c.Rand)
	if err != nil {
		return nil, nil, fmt.Errorf("server-cert: %w", err)
	}
	outputs, err := serverCertOutputs(o, cert, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("server-cert: %w", err)
	}
	out, err := c.record(receipts, issuance{
		op: opServerCert, key: s.Describe(), cert: cert,
		details: map[string]string{"sans": strings.Join(o.Hosts, ","), "caFingerprint": pki.CertFingerprint(o.CA)},
		outputs: outputs,
	}.plan())
	if err != nil {
		return nil, nil, fmt.Errorf("server-cert: %w", err)
	}
	return cert, out, nil
}

// serverCertOutputs are server.key and server.crt in o.Out and, in a
// ceremony directory, the Secret manifest (the daemon's cert dir) kept in
// step with them.
func serverCertOutputs(o ServerCertOptions, cert *x509.Certificate, keyPEM []byte) ([]placement, error) {
	crtPEM := pki.EncodeCertificates(cert)
	out := []placement{
		{Dir: o.Out, File: File{Name: certdir.FileServerKey, Data: keyPEM, Mode: 0o600}, Overwrite: o.Force},
		{Dir: o.Out, File: File{Name: certdir.FileServerCert, Data: crtPEM, Mode: 0o600}, Overwrite: o.Force},
	}
	secret, err := refreshedSecret(o.Out, o.CA, map[string][]byte{certdir.FileServerKey: keyPEM, certdir.FileServerCert: crtPEM})
	if err != nil || secret == nil {
		return out, err
	}
	return append(out, placement{Dir: o.Out, File: *secret, Overwrite: true}), nil
}

// refreshedSecret rebuilds kubernetes-secret.yaml of a ceremony directory
// (one holding os-ca.crt of ca and a token) with the files in extra
// replaced; it returns nil for any other directory.
func refreshedSecret(d Dir, ca *x509.Certificate, extra map[string][]byte) (*File, error) {
	st, err := readState(d)
	if err != nil {
		return nil, err
	}
	return planSecret(st, ca, extra)
}

// planSecret is refreshedSecret on a state read already.
func planSecret(st *state, ca *x509.Certificate, extra map[string][]byte) (*File, error) {
	if st.ca == nil || !st.ca.Equal(ca) || st.token == "" {
		return nil, nil
	}
	content := map[string][]byte{certdir.FileCACert: st.files[certdir.FileCACert], certdir.FileToken: st.files[certdir.FileToken]}
	for _, n := range []string{certdir.FileAcceptedCAs, certdir.FileTrustStatement} {
		if b, ok := st.files[n]; ok {
			content[n] = b
		}
	}
	for n, b := range extra {
		content[n] = b
	}
	data, err := certdir.KubernetesSecret(secretCluster(ca), content)
	if err != nil {
		return nil, err
	}
	return &File{Name: certdir.FileKubernetesSecret, Data: data, Mode: 0o600}, nil
}
