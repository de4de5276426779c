// Package file is the signer backend that keeps the CA key in a PEM file and
// therefore in process memory. It exists for development and for clusters
// that accept that risk; it is only used when a file: key URI is given.
//
// Key URIs follow RFC 8089: file:/abs/path or file:///abs/path. No host, query
// or fragment is accepted.
package file

import (
	"context"
	"crypto"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/steward-trustd/steward-trustd/internal/atomicfile"
	"github.com/steward-trustd/steward-trustd/internal/harden"
	"github.com/steward-trustd/steward-trustd/internal/keyutil"
	"github.com/steward-trustd/steward-trustd/internal/secretmount"
	"github.com/steward-trustd/steward-trustd/signer"
)

// Scheme is the key URI scheme of this backend.
const Scheme = "file"

// Backend opens and creates PEM key files.
type Backend struct {
	// Logger receives the one warning that the key is held in memory.
	// Nil discards it.
	Logger *slog.Logger
	// Rand is the entropy source for Generate; nil means crypto/rand.
	Rand io.Reader
}

// Scheme implements signer.Backend.
func (b *Backend) Scheme() string { return Scheme }

// ParseURI returns the absolute path a file: key URI names.
func ParseURI(uri string) (string, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", fmt.Errorf("%w: %w", signer.ErrInvalidURI, err)
	}
	if u.Scheme != Scheme {
		return "", fmt.Errorf("%w: scheme %q is not %q", signer.ErrInvalidURI, u.Scheme, Scheme)
	}
	if u.Opaque != "" {
		return "", fmt.Errorf("%w: file URI needs an absolute path (file:/path or file:///path), got %q", signer.ErrInvalidURI, uri)
	}
	if u.Host != "" || u.User != nil {
		return "", fmt.Errorf("%w: file URI must not name a host", signer.ErrInvalidURI)
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.RawFragment != "" {
		return "", fmt.Errorf("%w: file URI takes no query or fragment", signer.ErrInvalidURI)
	}
	p := u.Path
	if p == "" || !filepath.IsAbs(p) {
		return "", fmt.Errorf("%w: file URI needs an absolute path", signer.ErrInvalidURI)
	}
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%w: NUL in path", signer.ErrInvalidURI)
	}
	if filepath.Clean(p) != p {
		return "", fmt.Errorf("%w: path %q is not clean (want %q)", signer.ErrInvalidURI, p, filepath.Clean(p))
	}
	return p, nil
}

// URI returns the file: key URI for an absolute path.
func URI(path string) string {
	return (&url.URL{Scheme: Scheme, Path: path}).String()
}

// Open implements signer.Backend. It refuses a key file that group or
// others may read, but for a Kubernetes Secret mount (checkMode).
func (b *Backend) Open(ctx context.Context, uri string) (signer.Signer, error) {
	path, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("open key %s: %w", path, signer.ErrKeyNotFound)
		}
		return nil, fmt.Errorf("open key %s: %w", path, err)
	}
	defer func() { _ = f.Close() }() // read only
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("open key %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("open key %s: not a regular file", path)
	}
	if err := b.checkMode(path, f, st); err != nil {
		return nil, err
	}
	data, err := b.readLocked(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("open key %s: %w", path, err)
	}
	defer func() { clear(data); harden.Unlock(data) }()
	key, err := keyutil.ParsePrivateKeyPEM(data)
	if err != nil {
		return nil, fmt.Errorf("open key %s: %w", path, err)
	}
	return b.newSigner(ctx, key, path)
}

// readLocked reads the key file into one buffer of its size, locked in
// RAM first (harden.Lock) so the PEM never reaches swap; the caller
// zeroes it after parsing. Go's crypto keeps the parsed key on the heap,
// which no single lock covers: see README, "Core dumps and swap".
func (b *Backend) readLocked(f *os.File, size int64) ([]byte, error) {
	if size > harden.MaxLocked {
		return nil, fmt.Errorf("%d bytes is too large for a PEM key file (limit %d)", size, harden.MaxLocked)
	}
	data := make([]byte, size)
	if err := harden.Lock(data); err != nil && b.Logger != nil {
		b.Logger.Warn("the CA key file's bytes could not be locked in memory and may reach swap", "error", err)
	}
	if _, err := io.ReadFull(f, data); err != nil {
		clear(data)
		harden.Unlock(data)
		return nil, err
	}
	return data, nil
}

// checkMode refuses a key file that group or others may read, except a
// Kubernetes Secret mount readable by this process's fsGroup
// (internal/secretmount).
func (b *Backend) checkMode(path string, f *os.File, st fs.FileInfo) error {
	perm := st.Mode().Perm()
	if perm&0o077 == 0 {
		return nil
	}
	if err := secretmount.Check(path, f, st); err != nil {
		return fmt.Errorf("open key %s: mode %04o lets group or others read the CA key; run chmod 600 %s (%w)", path, perm, path, err)
	}
	if b.Logger != nil {
		b.Logger.Info("key file is group-readable as a Kubernetes Secret mount with the pod's fsGroup; accepted because the group is this process's own",
			"path", path, "mode", fmt.Sprintf("%04o", perm))
	}
	return nil
}

// FromPEM returns a signer for a PEM key that arrived some other way than
// a key file (e.g. an environment variable); location says where, for logs.
func (b *Backend) FromPEM(ctx context.Context, data []byte, location string) (signer.Signer, error) {
	key, err := keyutil.ParsePrivateKeyPEM(data)
	if err != nil {
		return nil, fmt.Errorf("key from %s: %w", location, err)
	}
	return b.newSigner(ctx, key, location)
}

// Generate implements signer.Backend: it writes a new PKCS#8 PEM key, mode
// 0600, and never replaces an existing file.
func (b *Backend) Generate(ctx context.Context, uri string, alg signer.Algorithm) (signer.Signer, error) {
	path, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	r := b.Rand
	if r == nil {
		r = rand.Reader
	}
	key, err := keyutil.GenerateKey(r, alg)
	if err != nil {
		return nil, err
	}
	return b.write(ctx, path, key)
}

// Import implements signer.Backend: it writes key as a PKCS#8 PEM file.
// A file cannot make a key non-extractable; Describe says so.
func (b *Backend) Import(ctx context.Context, uri string, key crypto.Signer) (signer.Signer, error) {
	path, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	return b.write(ctx, path, key)
}

func (b *Backend) write(ctx context.Context, path string, key crypto.Signer) (signer.Signer, error) {
	pemBytes, err := keyutil.MarshalPrivateKeyPEM(key)
	if err != nil {
		return nil, err
	}
	if err := atomicfile.Write(path, pemBytes, 0o600, false); err != nil {
		if errors.Is(err, atomicfile.ErrExists) {
			return nil, fmt.Errorf("write key %s: %w", path, signer.ErrKeyExists)
		}
		return nil, fmt.Errorf("write key: %w", err)
	}
	return b.newSigner(ctx, key, path)
}

// newSigner wraps key; its warning names the key's role from ctx.
func (b *Backend) newSigner(ctx context.Context, key crypto.Signer, path string) (*Signer, error) {
	pub := key.Public()
	fp, err := signer.Fingerprint(pub)
	if err != nil {
		return nil, err
	}
	if b.Logger != nil {
		b.Logger.Warn("the "+string(signer.KeyRoleOf(ctx))+" private key is held in process memory (file signer); use a tpm: or pkcs11: key URI to keep it on a device",
			"path", path, "fingerprint", fp)
	}
	return &Signer{key: key, desc: signer.Description{
		Backend:     Scheme,
		Algorithm:   signer.AlgorithmName(pub),
		Fingerprint: fp,
		Extractable: true,
		Location:    path,
	}}, nil
}

// Signer signs with a key read from a file.
type Signer struct {
	key  crypto.Signer
	desc signer.Description
}

// Public implements crypto.Signer.
func (s *Signer) Public() crypto.PublicKey { return s.key.Public() }

// Sign implements crypto.Signer after checking opts.
func (s *Signer) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if err := signer.CheckOpts(s.key.Public(), digest, opts); err != nil {
		return nil, err
	}
	if r == nil {
		r = rand.Reader
	}
	sig, err := s.key.Sign(r, digest, opts)
	if err != nil {
		return nil, fmt.Errorf("file sign: %w", err)
	}
	return sig, nil
}

// Describe implements signer.Signer.
func (s *Signer) Describe() signer.Description { return s.desc }

// Close implements signer.Signer; the key stays until garbage collected.
func (s *Signer) Close() error { return nil }
