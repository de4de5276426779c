package server

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
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
	// RootPins, if any, are the SHA-256 fingerprints (lower-case hex) of
	// the only roots os-ca.crt may be: in the tiered setup nothing else
	// ties os-ca.crt to anything at start (TRUSTD_ROOT_SHA256).
	RootPins []string
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

// Credentials reads token, os-ca.crt, accepted-cas.crt, its trust
// statement and issuer.crt and checks them with LoadCredentials.
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
	statement, err := d.read(certdir.FileTrustStatement, nil, true, &h)
	if err != nil {
		return nil, h.sum(), fmt.Errorf("trust statement: %w", err)
	}
	issuer, source, err := d.readIssuer(&h)
	if err != nil {
		return nil, h.sum(), fmt.Errorf("issuer chain: %w", err)
	}
	files := CredentialFiles{Token: token, CACert: ca, AcceptedCAs: accepted, TrustStatement: statement, IssuerChain: issuer, IssuerSource: source}
	c, err := LoadCredentials(files, d.SignerPublic, clockOrDefault(d.Clock)())
	if err == nil {
		err = d.checkRootPin(c.CA())
	}
	if err == nil && d.Token == nil {
		c.tokenFileMode = fileMode(filepath.Join(d.Dir, certdir.FileToken))
	}
	return c, h.sum(), err
}

// checkRootPin refuses an os-ca.crt that is not one of RootPins.
func (d CertDir) checkRootPin(root *x509.Certificate) error {
	fp := pki.CertFingerprint(root)
	if len(d.RootPins) == 0 || slices.Contains(d.RootPins, fp) {
		return nil
	}
	return fmt.Errorf("%s is %s, not a root pinned in $TRUSTD_ROOT_SHA256 (%s); put the pinned root back, or after a root rotation add the new root's fingerprint and restart", certdir.FileCACert, fp, strings.Join(d.RootPins, ","))
}

// fileMode is the permission bits of path (after symlinks: a Secret
// mount's file), 0 if it cannot be read.
func fileMode(path string) fs.FileMode {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Mode().Perm()
}

// LogTokenFile warns when the token file is readable by every user of
// the host: the token lets anyone obtain apid certificates.
func LogTokenFile(log *slog.Logger, c *Credentials) {
	if c.tokenFileMode&0o004 != 0 {
		log.Warn("the token file is readable by every user on this host; chmod 600 it (Kubernetes: defaultMode 0440 or 0400 on the Secret volume)",
			"file", certdir.FileToken, "mode", fmt.Sprintf("%04o", c.tokenFileMode))
	}
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
// is refused and the running one kept; so is one whose `ca` set the root
// did not vouch for (TrustError, trustd_reload_failed{what="trust"}).
type Reloader struct {
	Dir     CertDir
	Service *Service
	// Holder is the serving certificate to replace; nil when the serving
	// certificate is not from the cert dir (self-issued or inline).
	Holder  *CertHolder
	Metrics *Metrics
	Logger  *slog.Logger
	Clock   func() time.Time
	// ForceTokenReplace lets a token file that shares no token with the
	// running set be installed (TRUSTD_TOKEN_RELOAD_FORCE); otherwise it
	// is refused as TokenError.
	ForceTokenReplace bool

	creds, serving watched
	trust          trustGuard
}

// watched is where one file set stands: the digest running and the one
// last refused, with the metric label it was refused under.
type watched struct {
	current, bad Digest
	badWhat      string
}

// Prime records the digests of what the daemon loaded at start, and its
// trust statement as the newest seen.
func (r *Reloader) Prime(creds, serving Digest) {
	r.creds.current, r.serving.current = creds, serving
	if c := r.Service.Credentials(); c != nil {
		r.trust.installed(c)
	}
}

// Check reloads what changed since the last check.
func (r *Reloader) Check() {
	now := clockOrDefault(r.Clock)()
	c, d, err := r.Dir.Credentials()
	what := "credentials"
	if err == nil && d != r.creds.current {
		what, err = r.vet(c)
	}
	r.apply(what, d, err, &r.creds, func() {
		logServedChange(r.log(), r.Service.Credentials(), c)
		r.Service.SetCredentials(c)
		r.trust.installed(c)
		r.Metrics.SetReloadFailed(reloadTrust, false)
		r.Metrics.SetReloadFailed(reloadToken, false)
		r.log().Info("credentials reloaded", "ca_not_after", c.CA().NotAfter, "bundle_cas", c.BundleSize(), "tokens", c.tokens.fingerprints())
		LogIssuer(r.log(), c, now)
		LogTokenFile(r.log(), c)
	})
	if r.Holder == nil {
		return
	}
	cert, d, err := r.Dir.ServingCert(now)
	if err == nil && cert == nil {
		err = errors.New("serving certificate files were removed")
	}
	r.apply("serving", d, err, &r.serving, func() {
		r.Holder.Set(cert)
		r.Metrics.SetServingExpiry(cert.Leaf.NotAfter, now)
		r.log().Info("serving certificate reloaded", "not_after", cert.Leaf.NotAfter)
	})
}

// vet checks changed credentials against the running ones: the `ca` set
// must be vouched for by the root, and the token file must keep a
// running token unless forced. It returns the label a refusal is counted
// under.
func (r *Reloader) vet(c *Credentials) (string, error) {
	running := r.Service.Credentials()
	if err := r.trust.check(running, c); err != nil {
		return reloadTrust, err
	}
	if err := checkTokenChange(running.tokens, c.tokens, r.ForceTokenReplace); err != nil {
		return reloadToken, err
	}
	return "credentials", nil
}

// apply installs a changed file set, or refuses a broken one; files back
// at the running content clear an earlier refusal (trustd_reload_failed).
func (r *Reloader) apply(what string, d Digest, err error, w *watched, install func()) {
	if d == w.current {
		if w.bad != (Digest{}) {
			r.clearFailed(w.badWhat)
			r.log().Info("cert dir back to the running "+w.badWhat+"; the refused change is gone", "what", w.badWhat)
			w.bad = Digest{}
		}
		return
	}
	if err != nil {
		if d == w.bad {
			return // already reported this broken content
		}
		if w.bad != (Digest{}) && w.badWhat != what {
			r.clearFailed(w.badWhat) // that refused content is gone too
		}
		w.bad, w.badWhat = d, what
		r.Metrics.ObserveReload(what, err)
		r.logRefused(what, err)
		return
	}
	install()
	w.current, w.bad = d, Digest{}
	r.Metrics.ObserveReload(what, nil)
}

// clearFailed lowers trustd_reload_failed{what} once the content refused
// under it is gone; for "trust", to what the running credentials still
// say (accepted CAs left out since the start stay reported).
func (r *Reloader) clearFailed(what string) {
	failed := false
	if c := r.Service.Credentials(); what == reloadTrust && c != nil {
		failed = len(c.Trust().Unvouched) > 0 || c.Trust().StatementErr != nil
	}
	r.Metrics.SetReloadFailed(what, failed)
}

// logRefused logs a refused reload: at WARN with the CAs' fingerprints
// for a `ca` set the root did not vouch for, at ERROR otherwise.
func (r *Reloader) logRefused(what string, err error) {
	var te *TrustError
	if errors.As(err, &te) {
		r.log().Warn("reload refused: the root does not vouch for the ca set it would serve; keeping the running credentials", "reason", te.Reason, "cas", te.CAs)
		return
	}
	var ke *TokenError
	if errors.As(err, &ke) {
		r.log().Warn("reload refused: the token file keeps no running token; keeping the running tokens", "error", err)
		return
	}
	r.log().Error("reload refused; keeping the running "+what, "error", err)
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
