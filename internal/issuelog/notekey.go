package issuelog

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"

	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// C2SP signed-note signature types (c2sp.org/signed-note, "Signature types").
const (
	sigEd25519 byte = 0x01 // RFC 8032 over the note text
	sigECDSA   byte = 0x02 // ECDSA over SHA-256 of the note text, ASN.1 (transparency-dev/witness)
)

// NoteSigner signs checkpoints with the log key, a crypto.Signer opened
// from a key URI (a TPM, PKCS#11 or file key, never the CA key). Ed25519
// and ECDSA keys are supported: the two signed-note types a TPM or an HSM
// can hold.
type NoteSigner struct {
	name string
	typ  byte
	pub  []byte // the verifier's key encoding, after the type byte
	id   uint32
	key  crypto.Signer
}

// NewNoteSigner wraps key as the signer of the log named name (the
// checkpoint origin, e.g. "steward-trustd.example/node-a").
func NewNoteSigner(name string, key crypto.Signer) (*NoteSigner, error) {
	if !validName(name) {
		return nil, fmt.Errorf("log name %q: it must be non-empty printable text without spaces or '+' (e.g. steward-trustd.example/node-a)", name)
	}
	typ, pub, err := encodeKey(key.Public())
	if err != nil {
		return nil, err
	}
	return &NoteSigner{name: name, typ: typ, pub: pub, id: keyID(name, typ, pub), key: key}, nil
}

// Name implements note.Signer.
func (s *NoteSigner) Name() string { return s.name }

// KeyHash implements note.Signer.
func (s *NoteSigner) KeyHash() uint32 { return s.id }

// Sign implements note.Signer: RFC 8032 over the text for Ed25519, ECDSA
// over its SHA-256 otherwise (pki.SignMessage).
func (s *NoteSigner) Sign(msg []byte) ([]byte, error) {
	sig, err := pki.SignMessage(s.key, rand.Reader, msg)
	if err != nil {
		return nil, fmt.Errorf("log key: sign checkpoint: %w", err)
	}
	return sig, nil
}

// Verifier is the public verifier key owners pin:
// name+hex(key ID)+base64(type || public key).
func (s *NoteSigner) Verifier() string {
	return fmt.Sprintf("%s+%08x+%s", s.name, s.id, base64.StdEncoding.EncodeToString(append([]byte{s.typ}, s.pub...)))
}

// encodeKey is the signed-note encoding of a public key: the 32 bytes of
// an Ed25519 key, the DER SubjectPublicKeyInfo of an ECDSA key.
func encodeKey(pub crypto.PublicKey) (byte, []byte, error) {
	switch k := pub.(type) {
	case ed25519.PublicKey:
		return sigEd25519, k, nil
	case *ecdsa.PublicKey:
		der, err := x509.MarshalPKIXPublicKey(k)
		return sigECDSA, der, err
	}
	return 0, nil, fmt.Errorf("log key type %T: a log key must be Ed25519 or ECDSA (signed-note types 0x01 and 0x02); create one with --algorithm p256 or ed25519", pub)
}

// keyID is the signed-note key ID: SHA-256(name || 0x0A || type || key)
// for Ed25519 and cosignatures, SHA-256(SPKI) for ECDSA, first four
// bytes, big-endian.
func keyID(name string, typ byte, pub []byte) uint32 {
	h := sha256.New()
	if typ != sigECDSA {
		h.Write([]byte(name + "\n"))
		h.Write([]byte{typ})
	}
	h.Write(pub)
	return binary.BigEndian.Uint32(h.Sum(nil))
}

func validName(name string) bool {
	return name != "" && !strings.ContainsAny(name, "+ \t\n") && strings.IndexFunc(name, func(r rune) bool { return r < 0x20 }) < 0
}

// noteVerifier checks checkpoints against a pinned verifier key.
type noteVerifier struct {
	name string
	id   uint32
	pub  crypto.PublicKey
}

// NewVerifier parses a verifier key as NoteSigner.Verifier prints it.
func NewVerifier(vkey string) (note.Verifier, error) {
	name, id, raw, err := splitVerifier(vkey)
	if err != nil {
		return nil, err
	}
	v := &noteVerifier{name: name, id: id}
	if v.pub, err = decodeKey(raw[0], raw[1:]); err != nil {
		return nil, err
	}
	if keyID(name, raw[0], raw[1:]) != v.id {
		return nil, errors.New("log verifier key: the key ID does not match the key (copied wrongly?)")
	}
	return v, nil
}

// splitVerifier splits NAME+KEYID+BASE64 into its parts.
func splitVerifier(vkey string) (string, uint32, []byte, error) {
	name, rest, ok1 := strings.Cut(strings.TrimSpace(vkey), "+")
	idHex, b64, ok2 := strings.Cut(rest, "+")
	id, err := strconv.ParseUint(idHex, 16, 32)
	if !ok1 || !ok2 || err != nil || len(idHex) != 8 || !validName(name) {
		return "", 0, nil, errors.New("verifier key: want NAME+KEYID+BASE64 as printed by steward-trustd-ceremony log init or log witness")
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) < 2 {
		return "", 0, nil, errors.New("verifier key: the key part is not base64 of a type byte and a public key")
	}
	return name, uint32(id), raw, nil
}

func decodeKey(typ byte, b []byte) (crypto.PublicKey, error) {
	switch typ {
	case sigEd25519:
		if len(b) != ed25519.PublicKeySize {
			return nil, errors.New("log verifier key: an Ed25519 key is 32 bytes")
		}
		return ed25519.PublicKey(b), nil
	case sigECDSA:
		k, err := x509.ParsePKIXPublicKey(b)
		if _, ok := k.(*ecdsa.PublicKey); err != nil || !ok {
			return nil, errors.New("log verifier key: type 0x02 needs an ECDSA SubjectPublicKeyInfo")
		}
		return k, nil
	}
	return nil, fmt.Errorf("log verifier key: signature type %#x is not supported (0x01 Ed25519, 0x02 ECDSA)", typ)
}

func (v *noteVerifier) Name() string    { return v.name }
func (v *noteVerifier) KeyHash() uint32 { return v.id }
func (v *noteVerifier) Verify(msg, sig []byte) bool {
	return pki.VerifySignature(v.pub, msg, sig) == nil
}
