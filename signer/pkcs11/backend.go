//go:build cgo

package pkcs11

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"

	p11 "github.com/miekg/pkcs11"

	"github.com/steward-trustd/steward-trustd/internal/secretmount"
	"github.com/steward-trustd/steward-trustd/signer"
)

// maxPINFileBytes bounds what is read from a pin-source file.
const maxPINFileBytes = 4096

// Backend opens, generates and imports keys on PKCS#11 tokens. Use it by
// pointer; the zero value is ready.
type Backend struct {
	// Logger receives reconnect warnings (never a PIN). Nil discards them.
	Logger *slog.Logger
	// MaxSessions bounds the sessions each Signer keeps open (and so the
	// signatures in progress at once); 0 means DefaultMaxSessions. It is
	// lowered to what the token allows.
	MaxSessions int

	mods modules
	// createMu serialises Generate and Import so that the no-clobber
	// check and the object creation are atomic within the process.
	createMu sync.Mutex
}

// Scheme implements signer.Backend.
func (b *Backend) Scheme() string { return Scheme }

func (b *Backend) logger() *slog.Logger {
	if b.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return b.Logger
}

// checkPINMode warns about a PIN file that group or others may read,
// except a Kubernetes Secret mount readable by the pod's fsGroup, whose
// mode the user cannot change (internal/secretmount).
func (b *Backend) checkPINMode(path string, f *os.File) {
	st, err := f.Stat()
	if err != nil || st.Mode().Perm()&0o077 == 0 {
		return
	}
	if err := secretmount.Check(path, f, st); err != nil {
		b.logger().Warn("pkcs11 pin-source file is readable by group or others; chmod 600 it",
			"path", path, "mode", fmt.Sprintf("%04o", st.Mode().Perm()), "why_not_a_secret_mount", err.Error())
	}
}

// readPIN returns the user PIN the URI gives. An unreadable or empty
// pin-source is ErrAuthentication, and no login is attempted: a login with
// a wrong (empty) PIN counts towards the token's lockout.
func (b *Backend) readPIN(u *URI) (string, error) {
	if u.PINValue != "" {
		return u.PINValue, nil
	}
	f, err := os.Open(u.PINSource)
	if err != nil {
		return "", fmt.Errorf("pkcs11: read pin-source %s: %w: %w", u.PINSource, signer.ErrAuthentication, err)
	}
	defer func() { _ = f.Close() }() // read only
	b.checkPINMode(u.PINSource, f)
	data, err := io.ReadAll(io.LimitReader(f, maxPINFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("pkcs11: read pin-source %s: %w: %w", u.PINSource, signer.ErrAuthentication, err)
	}
	if len(data) > maxPINFileBytes {
		return "", fmt.Errorf("pkcs11: pin-source %s is larger than %d bytes: %w", u.PINSource, maxPINFileBytes, signer.ErrAuthentication)
	}
	pin := strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
	if pin == "" {
		return "", fmt.Errorf("pkcs11: pin-source %s is empty: %w", u.PINSource, signer.ErrAuthentication)
	}
	return pin, nil
}

// prepare parses the URI, reads the PIN and loads the module: everything
// before the first session.
func (b *Backend) prepare(uri string) (*URI, string, *module, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return nil, "", nil, err
	}
	pin, err := b.readPIN(u)
	if err != nil {
		return nil, "", nil, err
	}
	mod, err := b.mods.acquire(u.ModulePath)
	if err != nil {
		return nil, "", nil, err
	}
	return u, pin, mod, nil
}

// login opens a session on the token u names and logs the user in.
// CKR_USER_ALREADY_LOGGED_IN is success: the login is per application and
// token (PKCS#11 v2.40 §5.6), shared with other Signers.
func login(mod *module, u *URI, pin string, flags uint) (uint, p11.TokenInfo, p11.SessionHandle, error) {
	slot, ti, err := mod.findSlot(u)
	if err != nil {
		return 0, ti, 0, err
	}
	sh, err := mod.ctx.OpenSession(slot, p11.CKF_SERIAL_SESSION|flags)
	if err != nil {
		return 0, ti, 0, wrap("C_OpenSession", err)
	}
	if ti.Flags&p11.CKF_LOGIN_REQUIRED != 0 {
		if err := mod.ctx.Login(sh, p11.CKU_USER, pin); err != nil && !errors.Is(err, p11.Error(p11.CKR_USER_ALREADY_LOGGED_IN)) {
			_ = mod.ctx.CloseSession(sh)
			return 0, ti, 0, wrap(fmt.Sprintf("C_Login to token %q", u.Token), err)
		}
	}
	return slot, ti, sh, nil
}

// connect logs in and finds the key: a conn without id.
func connect(mod *module, u *URI, pin string) (conn, error) {
	gen := mod.generation()
	slot, _, sh, err := login(mod, u, pin, 0)
	if err != nil {
		return conn{}, err
	}
	key, err := findPrivateKey(mod.ctx, sh, u)
	if err != nil {
		_ = mod.ctx.CloseSession(sh)
		return conn{}, err
	}
	return conn{modGen: gen, slot: slot, anchor: sh, key: key}, nil
}

// Open implements signer.Backend. It refuses a key that is extractable or
// not sensitive unless the URI says allow-extractable=true.
func (b *Backend) Open(_ context.Context, uri string) (signer.Signer, error) {
	u, pin, mod, err := b.prepare(uri)
	if err != nil {
		return nil, err
	}
	s, err := b.open(u, pin, mod)
	if err != nil {
		b.mods.release(mod)
		return nil, err
	}
	return s, nil
}

// open opens the key on an acquired module. On error the caller releases
// the module.
func (b *Backend) open(u *URI, pin string, mod *module) (*Signer, error) {
	c, err := connect(mod, u, pin)
	if err != nil {
		return nil, err
	}
	s, err := b.newSigner(u, pin, mod, c)
	if err != nil {
		_ = mod.ctx.CloseSession(c.anchor)
		return nil, err
	}
	if err := s.selfTest(); err != nil {
		s.shutdown() // the caller releases the module
		return nil, err
	}
	return s, nil
}

func (b *Backend) newSigner(u *URI, pin string, mod *module, c conn) (*Signer, error) {
	ctx := mod.ctx
	ka, err := readKeyAttrs(ctx, c.anchor, c.key)
	if err != nil {
		return nil, err
	}
	sel := objectSelector(u)
	if !ka.canSign {
		return nil, fmt.Errorf("pkcs11: key %s has CKA_SIGN=false", sel)
	}
	if ka.alwaysAuth {
		return nil, fmt.Errorf("pkcs11: key %s has CKA_ALWAYS_AUTHENTICATE=true (a PIN per signature), which a CA daemon cannot provide", sel)
	}
	extractable := ka.extractable || !ka.sensitive
	if extractable && !u.AllowExtractable {
		var why []string
		if ka.extractable {
			why = append(why, "CKA_EXTRACTABLE=true (it can be wrapped off the token)")
		}
		if !ka.sensitive {
			why = append(why, "CKA_SENSITIVE=false (its value can be read in plaintext)")
		}
		return nil, fmt.Errorf("pkcs11: refusing key %s on token %q: %s; re-create it non-extractable, or add allow-extractable=true to the URI to accept the risk",
			sel, u.Token, strings.Join(why, " and "))
	}
	pub, err := readPublicKey(ctx, c.anchor, c.key, ka)
	if err != nil {
		return nil, err
	}
	fp, err := signer.Fingerprint(pub)
	if err != nil {
		return nil, err
	}
	tokenMax := uint(p11.CK_UNAVAILABLE_INFORMATION)
	if ti, err := ctx.GetTokenInfo(c.slot); err == nil {
		tokenMax = ti.MaxSessionCount
	}
	maxSessions := sessionLimit(b.MaxSessions, tokenMax)
	s := &Signer{
		mod:    mod,
		mods:   &b.mods,
		logger: b.logger(),
		uri:    u,
		pin:    pin,
		pub:    pub,
		sem:    make(chan struct{}, maxSessions),
		conn:   c,
		desc: signer.Description{
			Backend:     Scheme,
			Algorithm:   signer.AlgorithmName(pub),
			Fingerprint: fp,
			Extractable: extractable,
			Location:    u.keyLocation(),
		},
	}
	s.conn.id = 1
	s.healthy = true
	mod.setHealthy(1)
	return s, nil
}

// Generate implements signer.Backend: it generates a key pair on the token
// (sensitive, not extractable, on the token) and opens it. It fails with
// ErrKeyExists if any object on the token has the URI's id or label.
func (b *Backend) Generate(_ context.Context, uri string, alg signer.Algorithm) (signer.Signer, error) {
	mech, pubExtra, privExtra, err := generateParams(alg)
	if err != nil {
		return nil, err
	}
	return b.create(uri, func(ctx *p11.Ctx, sh p11.SessionHandle, id []byte, label string) ([]p11.ObjectHandle, error) {
		pubT := append(publicKeyTemplate(id, label), pubExtra...)
		privT := append(privateKeyTemplate(id, label), privExtra...)
		pub, priv, err := ctx.GenerateKeyPair(sh, []*p11.Mechanism{mech}, pubT, privT)
		if err != nil {
			if errors.Is(err, p11.Error(p11.CKR_MECHANISM_INVALID)) || errors.Is(err, p11.Error(p11.CKR_CURVE_NOT_SUPPORTED)) ||
				errors.Is(err, p11.Error(p11.CKR_DOMAIN_PARAMS_INVALID)) {
				return nil, fmt.Errorf("pkcs11: the token cannot generate %s: %w: %w", alg, signer.ErrUnsupportedAlgorithm, err)
			}
			return nil, generateError(err)
		}
		return []p11.ObjectHandle{priv, pub}, nil
	}, nil)
}

// Import implements signer.Backend: it creates key on the token as a
// sensitive, non-extractable private key object plus its public key
// object (C_CreateObject), then opens it, which signs on the token and
// verifies the signature. The software copy of key is the caller's to
// destroy. It fails with ErrKeyExists if any object on the token has the
// URI's id or label.
func (b *Backend) Import(_ context.Context, uri string, key crypto.Signer) (signer.Signer, error) {
	privA, pubA, err := importAttrs(key)
	if err != nil {
		return nil, err
	}
	return b.create(uri, func(ctx *p11.Ctx, sh p11.SessionHandle, id []byte, label string) ([]p11.ObjectHandle, error) {
		priv, err := ctx.CreateObject(sh, append(privateKeyTemplate(id, label), privA...))
		if err != nil {
			return nil, wrap("C_CreateObject(private key)", err)
		}
		pub, err := ctx.CreateObject(sh, append(publicKeyTemplate(id, label), pubA...))
		if err != nil {
			return []p11.ObjectHandle{priv}, wrap("C_CreateObject(public key)", err)
		}
		return []p11.ObjectHandle{priv, pub}, nil
	}, key.Public())
}

type createFunc func(ctx *p11.Ctx, sh p11.SessionHandle, id []byte, label string) ([]p11.ObjectHandle, error)

// create runs mk in a read-write session after the no-clobber check,
// then opens the new key. If opening fails (or the key is not want), the
// new objects are destroyed so that a retry is possible.
func (b *Backend) create(uri string, mk createFunc, want crypto.PublicKey) (signer.Signer, error) {
	u, pin, mod, err := b.prepare(uri)
	if err != nil {
		return nil, err
	}
	s, err := b.createOn(u, pin, mod, mk, want)
	if err != nil {
		b.mods.release(mod)
		return nil, err
	}
	return s, nil
}

func (b *Backend) createOn(u *URI, pin string, mod *module, mk createFunc, want crypto.PublicKey) (*Signer, error) {
	b.createMu.Lock()
	defer b.createMu.Unlock()
	_, _, sh, err := login(mod, u, pin, p11.CKF_RW_SESSION)
	if err != nil {
		return nil, err
	}
	ctx := mod.ctx
	defer ctx.CloseSession(sh) //nolint:errcheck // best effort at the end of a one-off session
	if err := noClobber(ctx, sh, u); err != nil {
		return nil, err
	}
	id := u.ID
	if id == nil {
		// Tools pair a private key with its public key and certificate by
		// CKA_ID: give the key one even if the URI selects it by label.
		id = make16()
	}
	objs, err := mk(ctx, sh, id, u.Object)
	destroy := func() {
		for _, o := range objs {
			_ = ctx.DestroyObject(sh, o) // best effort: the error we return matters more
		}
	}
	if err != nil {
		destroy()
		return nil, err
	}
	s, err := b.open(u, pin, mod)
	if err == nil && want != nil && !publicEqual(s.Public(), want) {
		s.shutdown() // the caller releases the module
		err = errors.New("pkcs11: the imported key reads back with a different public key")
	}
	if err != nil {
		destroy()
		return nil, fmt.Errorf("pkcs11: new key did not pass its checks and was removed: %w", err)
	}
	return s, nil
}

func make16() []byte {
	id := make([]byte, 16)
	_, _ = rand.Read(id) // crypto/rand.Read never fails (Go 1.24+)
	return id
}

// noClobber fails with ErrKeyExists if any object has the URI's id or
// label: generating next to an existing key would make the URI ambiguous.
func noClobber(ctx *p11.Ctx, sh p11.SessionHandle, u *URI) error {
	var tmpls [][]*p11.Attribute
	if u.ID != nil {
		tmpls = append(tmpls, []*p11.Attribute{p11.NewAttribute(p11.CKA_ID, u.ID)})
	}
	if u.Object != "" {
		tmpls = append(tmpls, []*p11.Attribute{p11.NewAttribute(p11.CKA_LABEL, u.Object)})
	}
	for _, t := range tmpls {
		objs, err := findObjects(ctx, sh, t)
		if err != nil {
			return err
		}
		if len(objs) > 0 {
			what := "object=" + escape(u.Object, isPathChar)
			if bytes.Equal(t[0].Value, u.ID) && t[0].Type == p11.CKA_ID {
				what = "that id"
			}
			return fmt.Errorf("pkcs11: token %q already has %d object(s) with %s: %w", u.Token, len(objs), what, signer.ErrKeyExists)
		}
	}
	return nil
}
