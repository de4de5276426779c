package tpm_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/signertest"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

var ctx = context.Background()

func blobURI(t *testing.T, extra string) string {
	u := "tpm:path=" + filepath.Join(t.TempDir(), "ca.tpmkey") + ";socket=/unused"
	if extra != "" {
		u += ";" + extra
	}
	return u
}

func TestSimulatorConformance(t *testing.T) {
	for _, alg := range []signer.Algorithm{signer.ECDSAP256, signer.ECDSAP384} {
		t.Run(string(alg), func(t *testing.T) {
			sim := tpmsim.NewSimulator(t)
			b := &tpm.Backend{Dial: sim.Dial}
			s, err := b.Generate(ctx, blobURI(t, "pcrs=7,11"), alg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			signertest.Run(t, s, signertest.Options{Concurrency: 4, SignaturesPerGoroutine: 2})
			d := s.Describe()
			if d.Backend != "tpm" || d.Extractable || d.Policy != "pcr sha256:7,11 + CC_Sign" || len(d.PolicyDigest) != 64 {
				t.Errorf("Describe() = %+v", d)
			}
		})
	}
}

func TestGenerateRefuses(t *testing.T) {
	sim := tpmsim.NewSimulator(t)
	b := &tpm.Backend{Dial: sim.Dial}
	tests := []struct {
		alg  signer.Algorithm
		want string
	}{
		{signer.Ed25519, "cannot hold Ed25519 keys"},
		{signer.RSA2048, "ECDSA keys only"},
		{"dsa", "unsupported"},
	}
	for _, tt := range tests {
		t.Run(string(tt.alg), func(t *testing.T) {
			_, err := b.Generate(ctx, blobURI(t, ""), tt.alg)
			if !errors.Is(err, signer.ErrUnsupportedAlgorithm) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Generate(%s) = %v, want ErrUnsupportedAlgorithm mentioning %q", tt.alg, err, tt.want)
			}
			if tt.alg == signer.Ed25519 {
				checkEd25519Hint(t, err)
			}
		})
	}
	t.Run("exists", func(t *testing.T) {
		uri := blobURI(t, "")
		s, err := b.Generate(ctx, uri, signer.ECDSAP256)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		if _, err := b.Generate(ctx, uri, signer.ECDSAP256); !errors.Is(err, signer.ErrKeyExists) {
			t.Fatalf("second Generate = %v, want ErrKeyExists", err)
		}
	})
	t.Run("ed25519 import", func(t *testing.T) {
		_, k, _ := ed25519.GenerateKey(rand.Reader)
		_, err := b.Import(ctx, blobURI(t, ""), k)
		if !errors.Is(err, signer.ErrUnsupportedAlgorithm) {
			t.Fatalf("Import(ed25519) = %v", err)
		}
		checkEd25519Hint(t, err)
	})
}

// checkEd25519Hint checks that an Ed25519 refusal is the typed error and
// tells the user every way out.
func checkEd25519Hint(t *testing.T, err error) {
	t.Helper()
	var uk *tpm.UnsupportedKeyError
	if !errors.As(err, &uk) || uk.Algorithm != signer.Ed25519 {
		t.Fatalf("%v is not a *tpm.UnsupportedKeyError for ed25519", err)
	}
	for _, want := range []string{"P-256", "P-384", "CKM_EDDSA", "pkcs11:", "file:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Ed25519 refusal %q does not mention %q", err, want)
		}
	}
}

func TestOpenReloads(t *testing.T) {
	sim := tpmsim.NewSimulator(t)
	b := &tpm.Backend{Dial: sim.Dial}
	uri := blobURI(t, "pcrs=7")
	g, err := b.Generate(ctx, uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	s, err := b.Open(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !g.Public().(*ecdsa.PublicKey).Equal(s.Public()) {
		t.Fatal("reopened key has another public key")
	}
	if _, err := b.Open(ctx, strings.Replace(uri, "pcrs=7", "pcrs=7,11", 1)); !errors.Is(err, signer.ErrInvalidURI) {
		t.Fatalf("Open with other pcrs = %v, want ErrInvalidURI", err)
	}
	missing := "tpm:path=" + filepath.Join(t.TempDir(), "none") + ";socket=/x"
	if _, err := b.Open(ctx, missing); !errors.Is(err, signer.ErrKeyNotFound) {
		t.Fatalf("Open(missing) = %v, want ErrKeyNotFound", err)
	}
}

func TestPolicyRefusesAfterExtend(t *testing.T) {
	sim := tpmsim.NewSimulator(t)
	var logs bytes.Buffer
	b := &tpm.Backend{Dial: sim.Dial, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	s, err := b.Generate(ctx, blobURI(t, "pcrs=7,11"), signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ts := s.(*tpm.Signer)
	if err := ts.CheckPolicy(ctx); err != nil {
		t.Fatalf("CheckPolicy before extend: %v", err)
	}
	sim.ExtendPCR(t, 11, []byte("new boot component"))
	d := sha256.Sum256([]byte("x"))
	_, err = s.Sign(nil, d[:], crypto.SHA256)
	if !errors.Is(err, signer.ErrPolicyNotSatisfied) {
		t.Fatalf("Sign after extend = %v, want ErrPolicyNotSatisfied", err)
	}
	if !errors.Is(err, tpm2.TPMRCValue) {
		t.Fatalf("Sign error %v does not carry TPM_RC_VALUE", err)
	}
	var f1 tpm2.TPMFmt1Error
	if !errors.As(err, &f1) {
		t.Fatalf("Sign error %v has no TPMFmt1Error", err)
	}
	if !strings.Contains(err.Error(), "PCR policy not satisfied") {
		t.Fatalf("error %q does not say the PCR policy is not satisfied", err)
	}
	if err := ts.CheckPolicy(ctx); !errors.Is(err, signer.ErrPolicyNotSatisfied) {
		t.Fatalf("CheckPolicy after extend = %v", err)
	}
	for i := 0; i < 5; i++ {
		if _, err := s.Sign(nil, d[:], crypto.SHA256); !errors.Is(err, signer.ErrPolicyNotSatisfied) {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "policy not satisfied; signing is refused"); n != 1 {
		t.Fatalf("policy failure logged %d times, want once per state change:\n%s", n, logs.String())
	}
}

// TestPersistentHandle covers handle= keys, whose policy digest is not
// known ahead: a PCR change shows up as TPM_RC_POLICY_FAIL on TPM2_Sign.
func TestPersistentHandle(t *testing.T) {
	sim := tpmsim.NewSimulator(t)
	b := &tpm.Backend{Dial: sim.Dial}
	uri := "tpm:handle=0x81000100;socket=/x;pcrs=7"
	s, err := b.Generate(ctx, uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		s.Close()
		_, err := tpm2.EvictControl{
			Auth:             tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
			ObjectHandle:     tpm2.NamedHandle{Handle: 0x81000100, Name: mustName(t, s)},
			PersistentHandle: 0x81000100,
		}.Execute(sim.TPM())
		if err != nil {
			t.Errorf("evict: %v", err)
		}
	}()
	if _, err := b.Generate(ctx, uri, signer.ECDSAP256); !errors.Is(err, signer.ErrKeyExists) {
		t.Fatalf("Generate on used handle = %v, want ErrKeyExists", err)
	}
	o, err := b.Open(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	signertest.Run(t, o, signertest.Options{Concurrency: 2, SignaturesPerGoroutine: 2})
	sim.ExtendPCR(t, 7, []byte("x"))
	d := sha256.Sum256([]byte("x"))
	_, err = o.Sign(nil, d[:], crypto.SHA256)
	if !errors.Is(err, signer.ErrPolicyNotSatisfied) || !errors.Is(err, tpm2.TPMRCPolicyFail) {
		t.Fatalf("Sign after extend = %v, want ErrPolicyNotSatisfied + TPM_RC_POLICY_FAIL", err)
	}
	if err := o.(*tpm.Signer).CheckPolicy(ctx); !errors.Is(err, signer.ErrPolicyNotSatisfied) {
		t.Fatalf("CheckPolicy = %v", err)
	}
	if _, err := b.Open(ctx, "tpm:handle=0x81000101;socket=/x"); !errors.Is(err, signer.ErrKeyNotFound) {
		t.Fatalf("Open(empty handle) = %v, want ErrKeyNotFound", err)
	}
	checkHandleWithoutPCRs(t, b, sim)
}

// checkHandleWithoutPCRs: a persistent key bound to PCRs 7 and 11, opened
// by a handle= URI without pcrs=, fails with a message that says the URI
// lacks pcrs=, not merely that the PCR values differ.
func checkHandleWithoutPCRs(t *testing.T, b *tpm.Backend, sim *tpmsim.Simulator) {
	t.Helper()
	const h = 0x81000102
	s, err := b.Generate(ctx, "tpm:handle=0x81000102;socket=/x;pcrs=7,11", signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	name := mustName(t, s)
	s.Close()
	defer func() {
		_, err := tpm2.EvictControl{
			Auth:             tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
			ObjectHandle:     tpm2.NamedHandle{Handle: h, Name: name},
			PersistentHandle: h,
		}.Execute(sim.TPM())
		if err != nil {
			t.Errorf("evict: %v", err)
		}
	}()
	o, err := b.Open(ctx, "tpm:handle=0x81000102;socket=/x")
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	d := sha256.Sum256([]byte("y"))
	_, err = o.Sign(nil, d[:], crypto.SHA256)
	if !errors.Is(err, signer.ErrPolicyNotSatisfied) || !strings.Contains(err.Error(), "names no pcrs=") {
		t.Fatalf("Sign through a handle= URI without pcrs= = %v, want a policy error naming the missing pcrs=", err)
	}
}

func mustName(t *testing.T, s signer.Signer) tpm2.TPM2BName {
	_, name := tpm.KeyHandle(s.(*tpm.Signer))
	return name
}

func TestImport(t *testing.T) {
	sim := tpmsim.NewSimulator(t)
	b := &tpm.Backend{Dial: sim.Dial}
	for _, c := range []elliptic.Curve{elliptic.P256(), elliptic.P384()} {
		t.Run(c.Params().Name, func(t *testing.T) {
			k, err := ecdsa.GenerateKey(c, rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			uri := blobURI(t, "")
			s, err := b.Import(ctx, uri, k)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if !k.PublicKey.Equal(s.Public()) {
				t.Fatal("imported key has another public key")
			}
			signertest.Run(t, s, signertest.Options{Concurrency: 2, SignaturesPerGoroutine: 2})
			checkBlobHasNoClearKey(t, strings.TrimPrefix(strings.Split(uri, ";")[0], "tpm:path="), k)
			testDuplicateRefused(t, sim, s.(*tpm.Signer))
		})
	}
	t.Run("rsa", func(t *testing.T) {
		k, _ := rsa.GenerateKey(rand.Reader, 2048)
		var uk *tpm.UnsupportedKeyError
		if _, err := b.Import(ctx, blobURI(t, ""), k); !errors.Is(err, signer.ErrUnsupportedAlgorithm) || !errors.As(err, &uk) || uk.Algorithm != signer.RSA2048 {
			t.Fatalf("Import(rsa) = %v", err)
		}
	})
}

// checkBlobHasNoClearKey looks for the private scalar in every encoding a
// careless writer could use.
func checkBlobHasNoClearKey(t *testing.T, path string, k *ecdsa.PrivateKey) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "TSS2 PRIVATE KEY" {
		t.Fatalf("blob is not a TSS2 PRIVATE KEY PEM: %q", data)
	}
	ecdh, _ := k.ECDH()
	d := ecdh.Bytes()
	pkcs8, _ := x509.MarshalPKCS8PrivateKey(k)
	for _, hay := range [][]byte{data, block.Bytes} {
		if bytes.Contains(hay, d) || bytes.Contains(hay, pkcs8) {
			t.Fatal("key blob contains the private key in the clear")
		}
	}
}

// testDuplicateRefused checks that an imported key (fixedTPM and
// fixedParent clear) still cannot be duplicated: TPM2_Duplicate needs a
// policy session (DUP role, Part 1 §19.7.5) and the key's policy allows
// TPM2_Sign only.
func testDuplicateRefused(t *testing.T, sim *tpmsim.Simulator, s *tpm.Signer) {
	t.Helper()
	key, name := tpm.KeyHandle(s)
	tp := sim.TPM()
	for _, cc := range []tpm2.TPMCC{tpm2.TPMCCDuplicate, tpm2.TPMCCSign} {
		sess, closeSess, err := tpm2.PolicySession(tp, tpm2.TPMAlgSHA256, 16)
		if err != nil {
			t.Fatal(err)
		}
		sel := tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{{Hash: tpm2.TPMAlgSHA256, PCRSelect: tpm2.PCClientCompatible.PCRs(7)}}}
		if _, err := (tpm2.PolicyPCR{PolicySession: sess.Handle(), Pcrs: sel}).Execute(tp); err != nil {
			t.Fatal(err)
		}
		if _, err := (tpm2.PolicyCommandCode{PolicySession: sess.Handle(), Code: cc}).Execute(tp); err != nil {
			t.Fatal(err)
		}
		_, err = tpm2.Duplicate{
			ObjectHandle:    tpm2.AuthHandle{Handle: key, Name: name, Auth: sess},
			NewParentHandle: tpm2.TPMRHNull,
			Symmetric:       tpm2.TPMTSymDef{Algorithm: tpm2.TPMAlgNull},
		}.Execute(tp)
		closeSess()
		if err == nil {
			t.Fatalf("TPM2_Duplicate with a PolicyCommandCode(%v) session succeeded", cc)
		}
		if !errors.Is(err, tpm2.TPMRCPolicyFail) && !errors.Is(err, tpm2.TPMRCPolicyCC) {
			t.Fatalf("TPM2_Duplicate (%v session) failed with %v, want a policy failure", cc, err)
		}
	}
}
