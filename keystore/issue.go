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
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/file"
)

// Target is one output file.
type Target struct {
	Dir  Dir
	Name string
}

// OpenCA opens the key at uri and checks that it is ca's key and that ca
// is a CA certificate.
func (c *Ceremony) OpenCA(ctx context.Context, uri string, ca *x509.Certificate) (signer.Signer, error) {
	if ca == nil {
		return nil, errors.New("a CA certificate is required")
	}
	if !ca.IsCA || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("certificate %q is not a CA certificate", ca.Subject)
	}
	s, err := c.Keys.Open(ctx, uri)
	if err != nil {
		return nil, fmt.Errorf("open CA key: %w", err)
	}
	if !pki.KeyMatchesCert(s.Public(), ca) {
		fp, _ := signer.Fingerprint(ca.PublicKey)
		s.Close()
		return nil, fmt.Errorf("%w: the key at the signer URI (fingerprint %s) is not the key of CA %q (fingerprint %s)", ErrKeyMismatch, s.Describe().Fingerprint, ca.Subject, fp)
	}
	return s, nil
}

// writeWithReceipt commits an issuing operation: its outputs, then its
// receipt, as one unit (WritePlaced). It reads the receipts directory
// once, under its lock, for the receipt's sequence number.
func (c *Ceremony) writeWithReceipt(receipts Dir, r Receipt, outputs []Placed) error {
	st, unlock, err := c.begin(receipts)
	if err != nil {
		return err
	}
	defer unlock()
	r.Time, r.ToolVersion = c.now().UTC(), c.Version
	rf, err := st.receiptFile(r, c.Rand)
	if err != nil {
		return err
	}
	return WritePlaced(append(outputs, Placed{Dir: receipts, File: rf}))
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
func (c *Ceremony) SignCSR(ctx context.Context, receipts Dir, o SignCSROptions) (*x509.Certificate, *Outcome, error) {
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
	defer s.Close()
	cert, err := pki.NewClientCertificate(o.CA, s, csr.PublicKey, csr.Subject.CommonName, roles, o.Validity, c.now(), c.Rand)
	if err != nil {
		return nil, nil, fmt.Errorf("sign-csr: %w", err)
	}
	r := newReceipt("sign-csr", c.Version, c.now(), s.Describe())
	certReceipt(&r, cert)
	r.Files = []string{o.Out.Dir.Path(o.Out.Name)}
	r.Details = map[string]string{"roles": strings.Join(roles, ","), "caFingerprint": pki.CertFingerprint(o.CA)}
	out := []Placed{{Dir: o.Out.Dir, File: File{Name: o.Out.Name, Data: pki.EncodeCertificates(cert), Mode: 0o644}, Overwrite: o.Force}}
	if err := c.writeWithReceipt(receipts, r, out); err != nil {
		return nil, nil, fmt.Errorf("sign-csr: %w", err)
	}
	return cert, &Outcome{Receipt: r, Written: r.Files}, nil
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
func (c *Ceremony) Talosconfig(ctx context.Context, receipts Dir, o TalosconfigOptions) (*Outcome, error) {
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
	defer s.Close()
	key, err := file.GenerateKey(c.Rand, signer.ECDSAP256)
	if err != nil {
		return nil, fmt.Errorf("talosconfig: generate client key: %w", err)
	}
	cert, err := pki.NewClientCertificate(o.CA, s, key.Public(), o.CommonName, roles, o.Validity, c.now(), c.Rand)
	if err != nil {
		return nil, fmt.Errorf("talosconfig: %w", err)
	}
	keyPEM, err := file.MarshalPrivateKeyPEM(key)
	if err != nil {
		return nil, err
	}
	trust := o.Trust
	if len(trust) == 0 {
		trust = []*x509.Certificate{o.CA}
	}
	cfg := clientconfig.NewConfig(o.Context, o.Endpoints, pki.EncodeCertificates(dedupe(trust)...),
		&talosx509.PEMEncodedCertificateAndKey{Crt: pki.EncodeCertificates(cert), Key: keyPEM})
	nodes := o.Nodes
	if len(nodes) == 0 {
		nodes = o.Endpoints
	}
	cfg.Contexts[o.Context].Nodes = nodes
	data, err := cfg.Bytes()
	if err != nil {
		return nil, fmt.Errorf("talosconfig: marshal: %w", err)
	}
	r := newReceipt("talosconfig", c.Version, c.now(), s.Describe())
	certReceipt(&r, cert)
	r.Files = []string{o.Out.Dir.Path(o.Out.Name)}
	r.Details = map[string]string{"roles": strings.Join(roles, ","), "context": o.Context, "endpoints": strings.Join(o.Endpoints, ","), "caFingerprint": pki.CertFingerprint(o.CA)}
	out := []Placed{{Dir: o.Out.Dir, File: File{Name: o.Out.Name, Data: data, Mode: 0o600}, Overwrite: o.Force}}
	if err := c.writeWithReceipt(receipts, r, out); err != nil {
		return nil, fmt.Errorf("talosconfig: %w", err)
	}
	return &Outcome{Receipt: r, Written: r.Files}, nil
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
func (c *Ceremony) ServerCert(ctx context.Context, receipts Dir, o ServerCertOptions) (*x509.Certificate, *Outcome, error) {
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
		if err := CheckAbsent(o.Out, []File{{Name: certdir.FileServerCert}, {Name: certdir.FileServerKey}}); err != nil {
			return nil, nil, fmt.Errorf("server-cert: %w", err)
		}
	}
	s, err := c.OpenCA(ctx, o.SignerURI, o.CA)
	if err != nil {
		return nil, nil, fmt.Errorf("server-cert: %w", err)
	}
	defer s.Close()
	cert, keyPEM, err := issueServing(o.CA, s, o.Hosts, o.Validity, c.now(), c.Rand)
	if err != nil {
		return nil, nil, fmt.Errorf("server-cert: %w", err)
	}
	r := newReceipt("server-cert", c.Version, c.now(), s.Describe())
	certReceipt(&r, cert)
	r.Files = []string{o.Out.Path(certdir.FileServerKey), o.Out.Path(certdir.FileServerCert)}
	r.Details = map[string]string{"sans": strings.Join(o.Hosts, ","), "caFingerprint": pki.CertFingerprint(o.CA)}
	out := []Placed{
		{Dir: o.Out, File: File{Name: certdir.FileServerKey, Data: keyPEM, Mode: 0o600}, Overwrite: o.Force},
		{Dir: o.Out, File: File{Name: certdir.FileServerCert, Data: pki.EncodeCertificates(cert), Mode: 0o600}, Overwrite: o.Force},
	}
	// In a ceremony directory the Secret manifest is the daemon's cert
	// dir: keep it in step with the new serving certificate.
	secret, err := refreshedSecret(o.Out, o.CA, map[string][]byte{certdir.FileServerKey: keyPEM, certdir.FileServerCert: pki.EncodeCertificates(cert)})
	if err != nil {
		return nil, nil, fmt.Errorf("server-cert: %w", err)
	}
	if secret != nil {
		out = append(out, Placed{Dir: o.Out, File: *secret, Overwrite: true})
		r.Files = append(r.Files, o.Out.Path(secret.Name))
	}
	if err := c.writeWithReceipt(receipts, r, out); err != nil {
		return nil, nil, fmt.Errorf("server-cert: %w", err)
	}
	return cert, &Outcome{Receipt: r, Written: r.Files}, nil
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
	if acc, ok := st.files[certdir.FileAcceptedCAs]; ok {
		content[certdir.FileAcceptedCAs] = acc
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
