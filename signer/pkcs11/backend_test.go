//go:build cgo

package pkcs11

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	p11 "github.com/miekg/pkcs11"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11/softhsm"
	"github.com/steward-trustd/steward-trustd/signer/signertest"
)

// newToken is the one place that decides skip or fail when SoftHSM is
// missing (softhsm.NewTest: fail under CI=true or
// STEWARD_REQUIRE_DEVICES=1, skip otherwise).
func newToken(t *testing.T) *softhsm.Token {
	t.Helper()
	return softhsm.NewTest(t, "trustd")
}

func mustGenerate(t *testing.T, b *Backend, uri string, alg signer.Algorithm) *Signer {
	t.Helper()
	s, err := b.Generate(context.Background(), uri, alg)
	if err != nil {
		t.Fatalf("Generate %s: %v", alg, err)
	}
	t.Cleanup(func() { s.Close() })
	return s.(*Signer)
}

func mustOpen(t *testing.T, b *Backend, uri string) *Signer {
	t.Helper()
	s, err := b.Open(context.Background(), uri)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s.(*Signer)
}

// raw is a second, independent handle on the SoftHSM library, logged in
// to the token: what another application in the process would see.
type raw struct {
	ctx  *p11.Ctx
	sh   p11.SessionHandle
	slot uint
}

// newRaw must be called after the Backend loaded the module, so that the
// Backend owns the library's initialisation.
func newRaw(t *testing.T, tok *softhsm.Token) *raw {
	t.Helper()
	ctx := p11.New(tok.ModulePath)
	if ctx == nil {
		t.Fatal("load module")
	}
	t.Cleanup(ctx.Destroy)
	if err := ctx.Initialize(); err != nil && !errors.Is(err, p11.Error(p11.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
		t.Fatal(err)
	}
	r := &raw{ctx: ctx}
	r.login(t, tok)
	return r
}

func (r *raw) login(t *testing.T, tok *softhsm.Token) {
	t.Helper()
	slots, err := r.ctx.GetSlotList(true)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range slots {
		ti, err := r.ctx.GetTokenInfo(id)
		if err == nil && ti.Label == tok.Label {
			r.slot = id
			r.sh, err = r.ctx.OpenSession(id, p11.CKF_SERIAL_SESSION|p11.CKF_RW_SESSION)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.ctx.Login(r.sh, p11.CKU_USER, tok.PIN); err != nil && !errors.Is(err, p11.Error(p11.CKR_USER_ALREADY_LOGGED_IN)) {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("token %q not found", tok.Label)
}

func (r *raw) find(t *testing.T, class uint, label string) p11.ObjectHandle {
	t.Helper()
	objs, err := findObjects(r.ctx, r.sh, keyTemplate(class, nil, label))
	if err != nil || len(objs) != 1 {
		t.Fatalf("find %q: %d objects, %v", label, len(objs), err)
	}
	return objs[0]
}

func TestConformance(t *testing.T) {
	tok := newToken(t)
	b := &Backend{}
	for _, tc := range []struct {
		name string
		alg  signer.Algorithm
		key  func() crypto.Signer // non-nil: Import instead of Generate
	}{
		{"generate-p256", signer.ECDSAP256, nil},
		{"generate-p384", signer.ECDSAP384, nil},
		{"generate-rsa2048", signer.RSA2048, nil},
		{"generate-ed25519", signer.Ed25519, nil},
		{"import-p256", "", func() crypto.Signer { k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader); return k }},
		{"import-ed25519", "", func() crypto.Signer { _, k, _ := ed25519.GenerateKey(rand.Reader); return k }},
		{"import-rsa2048", "", func() crypto.Signer { k, _ := rsa.GenerateKey(rand.Reader, 2048); return k }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uri := tok.URI(tc.name, []byte(tc.name))
			var s signer.Signer
			var err error
			if tc.key == nil {
				s, err = b.Generate(context.Background(), uri, tc.alg)
			} else {
				k := tc.key()
				s, err = b.Import(context.Background(), uri, k)
				if err == nil && !publicEqual(s.Public(), k.Public()) {
					t.Fatal("imported key has another public key")
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			signertest.Run(t, s, signertest.Options{})
			d := s.Describe()
			if d.Backend != "pkcs11" || d.Extractable {
				t.Errorf("Describe() = %+v", d)
			}
			// A fresh Open finds the same key.
			s2, err := b.Open(context.Background(), uri)
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			if s2.Describe().Fingerprint != d.Fingerprint {
				t.Errorf("reopened key has fingerprint %s, want %s", s2.Describe().Fingerprint, d.Fingerprint)
			}
		})
	}
}

// TestPrivateValueSensitive reads the private value of generated and
// imported keys through a second handle on the token: the token must
// refuse with CKR_ATTRIBUTE_SENSITIVE.
func TestPrivateValueSensitive(t *testing.T) {
	tok := newToken(t)
	b := &Backend{}
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	for _, tc := range []struct {
		label  string
		alg    signer.Algorithm
		key    crypto.Signer
		secret uint // the attribute holding the private value
	}{
		{"gen-p256", signer.ECDSAP256, nil, p11.CKA_VALUE},
		{"gen-ed25519", signer.Ed25519, nil, p11.CKA_VALUE},
		{"gen-rsa", signer.RSA2048, nil, p11.CKA_PRIVATE_EXPONENT},
		{"imp-p256", "", ec, p11.CKA_VALUE},
		{"imp-ed25519", "", ed, p11.CKA_VALUE},
		{"imp-rsa", "", rk, p11.CKA_PRIVATE_EXPONENT},
	} {
		t.Run(tc.label, func(t *testing.T) {
			uri := tok.URI(tc.label, nil)
			var err error
			var s signer.Signer
			if tc.key == nil {
				s, err = b.Generate(context.Background(), uri, tc.alg)
			} else {
				s, err = b.Import(context.Background(), uri, tc.key)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			r := newRaw(t, tok)
			priv := r.find(t, p11.CKO_PRIVATE_KEY, tc.label)
			_, err = r.ctx.GetAttributeValue(r.sh, priv, []*p11.Attribute{p11.NewAttribute(tc.secret, nil)})
			if !errors.Is(err, p11.Error(p11.CKR_ATTRIBUTE_SENSITIVE)) {
				t.Fatalf("C_GetAttributeValue(private value) = %v, want CKR_ATTRIBUTE_SENSITIVE", err)
			}
			a, err := r.ctx.GetAttributeValue(r.sh, priv, []*p11.Attribute{
				p11.NewAttribute(p11.CKA_SENSITIVE, nil), p11.NewAttribute(p11.CKA_EXTRACTABLE, nil), p11.NewAttribute(p11.CKA_TOKEN, nil),
			})
			if err != nil {
				t.Fatal(err)
			}
			if !attrBool(a[0].Value) || attrBool(a[1].Value) || !attrBool(a[2].Value) {
				t.Fatalf("CKA_SENSITIVE=%v CKA_EXTRACTABLE=%v CKA_TOKEN=%v", a[0].Value, a[1].Value, a[2].Value)
			}
		})
	}
}

func TestExtractableRefused(t *testing.T) {
	tok := newToken(t)
	b := &Backend{}
	// Load the module through the Backend first: it then owns the
	// library's initialisation.
	mustGenerate(t, b, tok.URI("anchor", nil), signer.ECDSAP256)
	r := newRaw(t, tok)
	for _, tc := range []struct {
		label                  string
		sensitive, extractable bool
		want                   string
	}{
		{"extractable", true, true, "CKA_EXTRACTABLE=true"},
		{"not-sensitive", false, false, "CKA_SENSITIVE=false"},
		{"both", false, true, "CKA_EXTRACTABLE=true (it can be wrapped off the token) and CKA_SENSITIVE=false"},
	} {
		t.Run(tc.label, func(t *testing.T) {
			priv := append(privateKeyTemplate([]byte(tc.label), tc.label), p11.NewAttribute(p11.CKA_SENSITIVE, tc.sensitive), p11.NewAttribute(p11.CKA_EXTRACTABLE, tc.extractable))
			// Later attributes override earlier ones of the same type in
			// SoftHSM, but do not rely on it: drop the defaults.
			priv = dedupe(priv)
			pub := append(publicKeyTemplate([]byte(tc.label), tc.label), p11.NewAttribute(p11.CKA_EC_PARAMS, paramsForCurve(elliptic.P256())))
			if _, _, err := r.ctx.GenerateKeyPair(r.sh, []*p11.Mechanism{p11.NewMechanism(p11.CKM_EC_KEY_PAIR_GEN, nil)}, pub, priv); err != nil {
				t.Fatal(err)
			}
			_, err := b.Open(context.Background(), tok.URI(tc.label, nil))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "allow-extractable=true") {
				t.Fatalf("Open = %v, want refusal mentioning %q", err, tc.want)
			}
			s := mustOpen(t, b, tok.URI(tc.label, nil, "allow-extractable=true"))
			if !s.Describe().Extractable {
				t.Error("Describe().Extractable = false for an extractable key")
			}
			if err := signAndVerify(s, []byte("x")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// dedupe keeps the last attribute of each type.
func dedupe(attrs []*p11.Attribute) []*p11.Attribute {
	last := map[uint]int{}
	for i, a := range attrs {
		last[a.Type] = i
	}
	var out []*p11.Attribute
	for i, a := range attrs {
		if last[a.Type] == i {
			out = append(out, a)
		}
	}
	return out
}

func TestErrors(t *testing.T) {
	tok := newToken(t)
	b := &Backend{}
	s := mustGenerate(t, b, tok.URI("os-ca", []byte{1}), signer.ECDSAP256)
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	emptyPIN := filepath.Join(t.TempDir(), "empty.pin")
	if err := os.WriteFile(emptyPIN, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const wrongPIN = "wrong-pin-9876"
	mp := "module-path=" + tok.ModulePath
	open := func(uri string) error { s, err := b.Open(context.Background(), uri); closeIf(s); return err }
	gen := func(uri string) error {
		s, err := b.Generate(context.Background(), uri, signer.ECDSAP256)
		closeIf(s)
		return err
	}
	imp := func(uri string) error { s, err := b.Import(context.Background(), uri, ec); closeIf(s); return err }
	tests := []struct {
		name    string
		call    func(string) error
		uri     string
		want    []error
		wantMsg string
	}{
		{"key not found", open, tok.URI("nope", nil), []error{signer.ErrKeyNotFound}, "no private key"},
		{"id not found", open, tok.URI("", []byte{2}), []error{signer.ErrKeyNotFound}, "id=%02"},
		{"token not found", open, "pkcs11:token=absent;object=os-ca?" + mp + "&pin-value=1", []error{signer.ErrDeviceUnavailable}, "no initialised token"},
		{"pin file missing", open, "pkcs11:token=trustd;object=os-ca?" + mp + "&pin-source=file:/nonexistent/pin", []error{signer.ErrAuthentication, fs.ErrNotExist}, "pin-source"},
		{"pin file empty", open, "pkcs11:token=trustd;object=os-ca?" + mp + "&pin-source=file:" + emptyPIN, []error{signer.ErrAuthentication}, "empty"},
		{"bad module", open, "pkcs11:token=trustd;object=os-ca?module-path=/nonexistent/lib.so&pin-value=1", nil, "cannot load module"},
		{"invalid uri", open, "pkcs11:token=trustd;object=os-ca", []error{signer.ErrInvalidURI}, "module-path is required"},
		{"generate over id", gen, tok.URI("other", []byte{1}), []error{signer.ErrKeyExists}, "already has"},
		{"generate over label", gen, tok.URI("os-ca", []byte{9}), []error{signer.ErrKeyExists}, "already has"},
		{"import over label", imp, tok.URI("os-ca", nil), []error{signer.ErrKeyExists}, "already has"},
		{"generate bad alg", func(u string) error {
			s, err := b.Generate(context.Background(), u, "dsa")
			closeIf(s)
			return err
		}, tok.URI("x", nil), []error{signer.ErrUnsupportedAlgorithm}, ""},
		{"import weak rsa", func(u string) error {
			k, _ := rsa.GenerateKey(rand.Reader, 1024)
			s, err := b.Import(context.Background(), u, k)
			closeIf(s)
			return err
		}, tok.URI("weak", nil), []error{signer.ErrUnsupportedAlgorithm}, "too weak"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call(tt.uri)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !errors.Is(err, w) {
					t.Errorf("error %q is not %v", err, w)
				}
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not say %q", err, tt.wantMsg)
			}
			for _, secret := range []string{wrongPIN, tok.PIN} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q contains a PIN", err)
				}
			}
		})
	}
	// The key is still there and usable after all that.
	if err := signAndVerify(s, []byte("still fine")); err != nil {
		t.Fatal(err)
	}
}

// TestWrongPIN opens with a wrong PIN while nobody in the process is
// logged in (a login is per application: while another Signer is logged
// in, C_Login answers CKR_USER_ALREADY_LOGGED_IN without checking it).
func TestWrongPIN(t *testing.T) {
	tok := newToken(t)
	b := &Backend{}
	s, err := b.Generate(context.Background(), tok.URI("os-ca", nil), signer.ECDSAP256)
	must(t, err)
	must(t, s.Close())
	const wrongPIN = "wrong-pin-9876"
	_, err = b.Open(context.Background(), "pkcs11:token=trustd;object=os-ca?module-path="+tok.ModulePath+"&pin-value="+wrongPIN)
	if !errors.Is(err, signer.ErrAuthentication) || !errors.Is(err, p11.Error(p11.CKR_PIN_INCORRECT)) {
		t.Fatalf("Open with a wrong PIN = %v, want ErrAuthentication and CKR_PIN_INCORRECT", err)
	}
	if strings.Contains(err.Error(), wrongPIN) {
		t.Fatalf("error %q contains the PIN", err)
	}
	// An unreadable pin-source stops before the module is even loaded, so
	// no login (with an empty PIN) can have been attempted.
	b2 := &Backend{}
	_, err = b2.Open(context.Background(), "pkcs11:token=trustd;object=os-ca?module-path="+tok.ModulePath+"&pin-source=file:"+filepath.Join(t.TempDir(), "missing"))
	if !errors.Is(err, signer.ErrAuthentication) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open with a missing PIN file = %v", err)
	}
	if len(b2.mods.m) != 0 {
		t.Fatal("the module was loaded although the PIN could not be read")
	}
	// The right PIN still works: one failure did not lock the token.
	s2 := mustOpen(t, b, tok.URI("os-ca", nil))
	must(t, signAndVerify(s2, []byte("ok")))
}

func closeIf(s signer.Signer) {
	if s != nil {
		s.Close()
	}
}

func TestDescribe(t *testing.T) {
	tok := newToken(t)
	b := &Backend{}
	uri := "pkcs11:token=trustd;object=os-ca;id=%01?module-path=" + tok.ModulePath + "&pin-value=" + tok.PIN
	s := mustGenerate(t, b, uri, signer.Ed25519)
	d := s.Describe()
	if d.Backend != "pkcs11" || d.Algorithm != "Ed25519" || d.Extractable {
		t.Errorf("Describe() = %+v", d)
	}
	want := "pkcs11:token=trustd;object=os-ca;id=%01?module-path=" + tok.ModulePath
	if d.Location != want {
		t.Errorf("Location = %q, want %q", d.Location, want)
	}
	if strings.Contains(d.Location, tok.PIN) {
		t.Error("Location contains the PIN")
	}
}

// waitSign signs until it works or the deadline passes, and returns the
// errors seen before it worked.
func waitSign(t *testing.T, s *Signer, within time.Duration) []error {
	t.Helper()
	var errs []error
	deadline := time.Now().Add(within)
	for {
		err := signAndVerify(s, []byte("after recovery"))
		if err == nil {
			return errs
		}
		if !errors.Is(err, signer.ErrDeviceUnavailable) {
			t.Fatalf("while recovering: %v (not ErrDeviceUnavailable)", err)
		}
		errs = append(errs, err)
		if time.Now().After(deadline) {
			t.Fatalf("no recovery within %v: %v", within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestFaults(t *testing.T) {
	tests := []struct {
		name string
		// fault breaks the token under the signer; wantRV is the PKCS#11
		// code the first failing Sign must carry.
		fault  func(t *testing.T, tok *softhsm.Token, r *raw)
		wantRV uint
		// restore brings the token back, if the fault needs it.
		restore func(t *testing.T, tok *softhsm.Token)
	}{
		{
			name:   "module finalized",
			fault:  func(t *testing.T, _ *softhsm.Token, r *raw) { must(t, r.ctx.Finalize()) },
			wantRV: p11.CKR_CRYPTOKI_NOT_INITIALIZED,
		},
		{
			// SoftHSM reports a private key's handle invalid once the
			// application is logged out, rather than CKR_USER_NOT_LOGGED_IN.
			name:   "login lost",
			fault:  func(t *testing.T, _ *softhsm.Token, r *raw) { must(t, r.ctx.Logout(r.sh)) },
			wantRV: p11.CKR_OBJECT_HANDLE_INVALID,
		},
		{
			name:    "token removed and restored",
			fault:   func(t *testing.T, tok *softhsm.Token, _ *raw) { must(t, tok.Remove()) },
			wantRV:  p11.CKR_OBJECT_HANDLE_INVALID,
			restore: func(t *testing.T, tok *softhsm.Token) { must(t, tok.Restore()) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok := newToken(t)
			b := &Backend{}
			s := mustGenerate(t, b, tok.URI("os-ca", []byte{1}), signer.ECDSAP256)
			r := newRaw(t, tok)
			tt.fault(t, tok, r)
			d := sha256.Sum256([]byte("m"))
			_, err := s.Sign(nil, d[:], crypto.SHA256)
			if !errors.Is(err, signer.ErrDeviceUnavailable) || !errors.Is(err, p11.Error(tt.wantRV)) {
				t.Fatalf("Sign after fault = %v, want ErrDeviceUnavailable and %s", err, p11.Error(tt.wantRV))
			}
			if tt.restore != nil {
				// While the token is away, requests fail fast as unavailable.
				time.Sleep(300 * time.Millisecond)
				for i := 0; i < 3; i++ {
					if _, err := s.Sign(nil, d[:], crypto.SHA256); !errors.Is(err, signer.ErrDeviceUnavailable) {
						t.Fatalf("Sign while the token is away = %v, want ErrDeviceUnavailable", err)
					}
				}
				tt.restore(t, tok)
			}
			waitSign(t, s, 15*time.Second)
		})
	}
}

// TestTokenReinitialised: a re-initialised token has lost the key. The
// signer stays unavailable; it never signs with a new key that took the
// old one's label and id, and it recovers when the same key is imported
// again.
func TestTokenReinitialised(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sameKey  bool
		wantMsg  string // in the Sign error while the wrong key is there
		recovers bool
	}{
		{"impostor key", false, "not the key that was opened", false},
		{"same key re-imported", true, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := newToken(t)
			b := &Backend{}
			key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			uri := tok.URI("os-ca", []byte{1})
			s0, err := b.Import(context.Background(), uri, key)
			must(t, err)
			s := s0.(*Signer)
			defer s.Close()
			must(t, tok.Reinit())
			d := sha256.Sum256([]byte("m"))
			if _, err := s.Sign(nil, d[:], crypto.SHA256); !errors.Is(err, signer.ErrDeviceUnavailable) {
				t.Fatalf("Sign after re-init = %v, want ErrDeviceUnavailable", err)
			}
			// Wait for the signer to have re-initialised the module and
			// found the token without the key.
			waitErr(t, s, func(err error) bool { return errors.Is(err, signer.ErrKeyNotFound) })
			// Another application puts a key under the same label and id.
			b2 := &Backend{}
			var again signer.Signer
			if tc.sameKey {
				again, err = b2.Import(context.Background(), uri, key)
			} else {
				again, err = b2.Generate(context.Background(), uri, signer.ECDSAP256)
			}
			must(t, err)
			defer again.Close()
			if tc.recovers {
				waitSign(t, s, 10*time.Second)
				return
			}
			waitErr(t, s, func(err error) bool { return strings.Contains(err.Error(), tc.wantMsg) })
		})
	}
}

// waitErr signs until the error satisfies ok; every error on the way
// must be ErrDeviceUnavailable, and no signature may succeed.
func waitErr(t *testing.T, s *Signer, ok func(error) bool) {
	t.Helper()
	d := sha256.Sum256([]byte("m"))
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := s.Sign(nil, d[:], crypto.SHA256)
		if err == nil {
			t.Fatal("signer signed while its key was gone or replaced")
		}
		if !errors.Is(err, signer.ErrDeviceUnavailable) {
			t.Fatalf("Sign = %v, want ErrDeviceUnavailable", err)
		}
		if ok(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("expected error not seen; last: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWrongPINOnReconnect: the token's PIN changed under the signer; the
// reconnect tries it once and then stays failed with ErrAuthentication.
func TestWrongPINOnReconnect(t *testing.T) {
	tok := newToken(t)
	b := &Backend{}
	s := mustGenerate(t, b, tok.URI("os-ca", []byte{1}), signer.ECDSAP256)
	r := newRaw(t, tok)
	must(t, r.ctx.SetPIN(r.sh, tok.PIN, "a-new-pin"))
	must(t, r.ctx.Logout(r.sh))
	deadline := time.Now().Add(10 * time.Second)
	d := sha256.Sum256([]byte("m"))
	for {
		_, err := s.Sign(nil, d[:], crypto.SHA256)
		if errors.Is(err, signer.ErrAuthentication) {
			if !errors.Is(err, p11.Error(p11.CKR_PIN_INCORRECT)) {
				t.Fatalf("error %v lacks CKR_PIN_INCORRECT", err)
			}
			break
		}
		if !errors.Is(err, signer.ErrDeviceUnavailable) {
			t.Fatalf("Sign = %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no auth failure reported: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Exactly one failed login: SoftHSM counts failures in the token's
	// flags only coarsely, so check the signer gave up instead.
	s.mu.Lock()
	recovering := s.recovering
	s.mu.Unlock()
	if recovering {
		t.Fatal("signer is still trying to log in after the PIN was refused")
	}
}

func TestConcurrentClients(t *testing.T) {
	tok := newToken(t)
	for _, maxSessions := range []int{2, 8} {
		b := &Backend{MaxSessions: maxSessions}
		s := mustGenerate(t, b, tok.URI(fmt.Sprintf("k%d", maxSessions), []byte{byte(maxSessions)}), signer.ECDSAP256)
		var wg sync.WaitGroup
		errs := make(chan error, 8*50)
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := 0; i < 50; i++ {
					if err := signAndVerify(s, []byte{byte(g), byte(i)}); err != nil {
						errs <- err
					}
				}
			}(g)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("max-sessions %d: %v", maxSessions, err)
		}
		s.mu.Lock()
		idle := len(s.idle)
		s.mu.Unlock()
		if idle > maxSessions {
			t.Errorf("max-sessions %d: %d idle sessions", maxSessions, idle)
		}
		s.Close()
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// BenchmarkSign measures raw token signatures through the Signer (no
// certificate work): go test -run '^$' -bench . ./signer/pkcs11/
func BenchmarkSign(b *testing.B) {
	for _, alg := range []signer.Algorithm{signer.ECDSAP256, signer.Ed25519} {
		b.Run(string(alg), func(b *testing.B) {
			tok := softhsm.NewTest(b, "bench")
			be := &Backend{}
			s, err := be.Generate(context.Background(), tok.URI("k", []byte{1}), alg)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			var opts crypto.SignerOpts = crypto.SHA256
			msg := sha256.Sum256([]byte("bench"))
			data := msg[:]
			if alg == signer.Ed25519 {
				opts = crypto.Hash(0)
			}
			b.Run("serial", func(b *testing.B) {
				for b.Loop() {
					if _, err := s.Sign(nil, data, opts); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "sigs/s")
			})
			b.Run("parallel", func(b *testing.B) {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := s.Sign(nil, data, opts); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "sigs/s")
			})
		})
	}
}
