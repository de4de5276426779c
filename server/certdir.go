package server

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
)

// CertDir reads the daemon's credentials from a directory (a mounted
// Kubernetes Secret, or /etc/steward-trustd/certs), with optional inline
// values that take the place of the token and CA files.
type CertDir struct {
	// Dir is the directory.
	Dir string
	// Token, CACert and IssuerChain, when non-nil, replace the token,
	// os-ca.crt and issuer.crt files.
	Token, CACert, IssuerChain []byte
	// IssuerFile, if set, is read instead of <Dir>/issuer.crt (and must
	// exist): replicas sharing one Secret each pick their own chain, e.g.
	// /etc/steward-trustd/nodes/$(NODE_NAME).crt.
	IssuerFile string
	// SignerPublic is the signer's key, which issuer.crt's first
	// certificate (or, without issuer.crt, os-ca.crt) must hold.
	SignerPublic crypto.PublicKey
	// Clock checks the issuer chain's validity; nil means time.Now.
	Clock func() time.Time
}

// Digest identifies the content of one read of a file set, so that a
// reload happens only when something changed.
type Digest [sha256.Size]byte

func (d CertDir) read(name string, inline []byte, optional bool, h *digestBuilder) ([]byte, error) {
	if inline != nil {
		h.add(name, inline)
		return inline, nil
	}
	return readDigested(filepath.Join(d.Dir, name), name, optional, h)
}

// readDigested reads path into h under name. A failed read has a digest
// of its own, or the reloader would take it for no change (or for the
// last refusal) and say nothing.
func readDigested(path, name string, optional bool, h *digestBuilder) ([]byte, error) {
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		h.add(name, b)
	case optional && errors.Is(err, fs.ErrNotExist):
		h.add(name, nil)
		return nil, nil
	default:
		h.add(name+" unreadable", []byte(err.Error()))
	}
	return b, err
}

// Credentials reads token, os-ca.crt, accepted-cas.crt and issuer.crt
// and checks them with LoadCredentials.
func (d CertDir) Credentials() (*Credentials, Digest, error) {
	var h digestBuilder
	token, err := d.read(certdir.FileToken, d.Token, false, &h)
	if err != nil {
		return nil, h.sum(), fmt.Errorf("worker token (set $TRUSTD_TOKEN or provide %s): %w", certdir.FileToken, err)
	}
	ca, err := d.read(certdir.FileCACert, d.CACert, false, &h)
	if err != nil {
		return nil, h.sum(), fmt.Errorf("OS CA certificate (set $TRUSTD_OS_CA_CRT or provide %s): %w", certdir.FileCACert, err)
	}
	accepted, err := d.read(certdir.FileAcceptedCAs, nil, true, &h)
	if err != nil {
		return nil, h.sum(), fmt.Errorf("accepted CAs: %w", err)
	}
	issuer, source, err := d.readIssuer(&h)
	if err != nil {
		return nil, h.sum(), fmt.Errorf("issuer chain: %w", err)
	}
	files := CredentialFiles{Token: token, CACert: ca, AcceptedCAs: accepted, IssuerChain: issuer, IssuerSource: source}
	c, err := LoadCredentials(files, d.SignerPublic, clockOrDefault(d.Clock)())
	return c, h.sum(), err
}

// readIssuer reads the issuer chain: inline, from IssuerFile (required),
// or <Dir>/issuer.crt (optional). It returns its source for messages.
func (d CertDir) readIssuer(h *digestBuilder) ([]byte, string, error) {
	switch {
	case d.IssuerChain != nil:
		h.add(certdir.FileIssuerChain, d.IssuerChain)
		return d.IssuerChain, "$TRUSTD_ISSUER_CRT", nil
	case d.IssuerFile != "":
		b, err := readDigested(d.IssuerFile, certdir.FileIssuerChain, false, h)
		return b, d.IssuerFile, err
	}
	b, err := d.read(certdir.FileIssuerChain, nil, true, h)
	return b, filepath.Join(d.Dir, certdir.FileIssuerChain), err
}

// ServingCert reads server.crt and server.key; it returns nil, nil when
// neither exists.
func (d CertDir) ServingCert(now time.Time) (*tls.Certificate, Digest, error) {
	var h digestBuilder
	crt, err := d.read(certdir.FileServerCert, nil, true, &h)
	if err != nil {
		return nil, h.sum(), err
	}
	key, err := d.read(certdir.FileServerKey, nil, true, &h)
	if err != nil {
		return nil, h.sum(), err
	}
	if crt == nil && key == nil {
		return nil, h.sum(), nil
	}
	if (crt == nil) != (key == nil) {
		return nil, h.sum(), fmt.Errorf("%s and %s must both exist in %s, or neither", certdir.FileServerCert, certdir.FileServerKey, d.Dir)
	}
	c, err := LoadKeyPair(crt, key, now)
	return c, h.sum(), err
}

type digestBuilder struct{ parts []byte }

func (h *digestBuilder) add(name string, b []byte) {
	s := sha256.Sum256(b)
	h.parts = append(h.parts, name...)
	h.parts = append(h.parts, 0)
	if b != nil {
		h.parts = append(h.parts, s[:]...)
	}
}

func (h *digestBuilder) sum() Digest { return sha256.Sum256(h.parts) }

// Reloader polls the cert dir and swaps credentials and the serving
// certificate when their files change. Kubernetes updates a mounted
// Secret by swapping a symlink, which an inotify watch on the files would
// miss; reading by name every few seconds sees it. A broken new file set
// is refused and the running one kept.
type Reloader struct {
	Dir     CertDir
	Service *Service
	// Holder is the serving certificate to replace; nil when the serving
	// certificate is not from the cert dir (self-issued or inline).
	Holder  *CertHolder
	Metrics *Metrics
	Logger  *slog.Logger
	Clock   func() time.Time

	creds, serving       Digest
	badCreds, badServing Digest
}

// Prime records the digests of what the daemon loaded at start.
func (r *Reloader) Prime(creds, serving Digest) { r.creds, r.serving = creds, serving }

// Check reloads what changed since the last check.
func (r *Reloader) Check() {
	now := clockOrDefault(r.Clock)()
	c, d, err := r.Dir.Credentials()
	r.apply("credentials", d, err, &r.creds, &r.badCreds, func() {
		r.Service.SetCredentials(c)
		r.log().Info("credentials reloaded", "ca_not_after", c.CA().NotAfter, "bundle_cas", c.BundleSize())
		LogIssuer(r.log(), c, now)
	})
	if r.Holder == nil {
		return
	}
	cert, d, err := r.Dir.ServingCert(now)
	if err == nil && cert == nil {
		err = errors.New("serving certificate files were removed")
	}
	r.apply("serving", d, err, &r.serving, &r.badServing, func() {
		r.Holder.Set(cert)
		r.Metrics.SetServingExpiry(cert.Leaf.NotAfter, now)
		r.log().Info("serving certificate reloaded", "not_after", cert.Leaf.NotAfter)
	})
}

// apply installs a changed file set, or refuses a broken one; files back
// at the running content clear an earlier refusal (trustd_reload_failed).
func (r *Reloader) apply(what string, d Digest, err error, current, bad *Digest, install func()) {
	if d == *current {
		if *bad != (Digest{}) {
			*bad = Digest{}
			r.Metrics.SetReloadFailed(what, false)
			r.log().Info("cert dir back to the running "+what+"; the refused change is gone", "what", what)
		}
		return
	}
	if err != nil {
		if d == *bad {
			return // already reported this broken content
		}
		*bad = d
		r.Metrics.ObserveReload(what, err)
		r.log().Error("reload refused; keeping the running "+what, "error", err)
		return
	}
	install()
	*current, *bad = d, Digest{}
	r.Metrics.ObserveReload(what, nil)
}

// Run checks every interval until ctx ends.
func (r *Reloader) Run(ctx context.Context, interval time.Duration) { every(ctx, interval, r.Check) }

// every calls f once per interval until ctx ends.
func every(ctx context.Context, interval time.Duration, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

func (r *Reloader) log() *slog.Logger {
	if r.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Logger
}
