//go:build cgo

package pkcs11

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/asn1"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"

	p11 "github.com/miekg/pkcs11"

	"github.com/steward-trustd/steward-trustd/signer"
)

// PKCS#11 v3.0 §2.3.5-2.3.6 (Edwards curves) constants that
// miekg/pkcs11 v1.1.2 does not define.
const (
	ckkECEdwards           = 0x00000040 // CKK_EC_EDWARDS
	ckmECEdwardsKeyPairGen = 0x00001055 // CKM_EC_EDWARDS_KEY_PAIR_GEN
	ckmEdDSA               = 0x00001057 // CKM_EDDSA
	maxObjectsPerFind      = 16
	rsaPublicExponent      = 65537
	ed25519OIDDER          = "\x06\x03\x2b\x65\x70" // id-Ed25519, RFC 8410 §3
	ed25519PrintableDER    = "\x13\x0cedwards25519" // PKCS#11 v3.0 curve name form
	selfTestMessage        = "steward-trustd pkcs11 key self-test"
)

// DER OIDs of the named curves, as CKA_EC_PARAMS holds them (RFC 5480 §2.1.1.1).
var curveOIDs = []struct {
	curve elliptic.Curve
	der   []byte
}{
	{elliptic.P256(), []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}},
	{elliptic.P384(), []byte{0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22}},
	{elliptic.P521(), []byte{0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x23}},
}

func curveFromParams(params []byte) (elliptic.Curve, bool) {
	for _, c := range curveOIDs {
		if bytes.Equal(c.der, params) {
			return c.curve, true
		}
	}
	return nil, false
}

func paramsForCurve(c elliptic.Curve) []byte {
	for _, o := range curveOIDs {
		if o.curve == c {
			return o.der
		}
	}
	return nil
}

func isEd25519Params(params []byte) bool {
	return string(params) == ed25519OIDDER || string(params) == ed25519PrintableDER
}

// keyAttrs are the private key attributes read at open.
type keyAttrs struct {
	keyType     uint
	sensitive   bool
	extractable bool
	alwaysAuth  bool
	canSign     bool
	id          []byte
	label       string
}

func attrBool(v []byte) bool { return len(v) > 0 && v[0] != 0 }

// attrUint decodes a CK_ULONG attribute, which the module returns in host
// byte order and size.
func attrUint(v []byte) (uint, error) {
	switch len(v) {
	case 8:
		return uint(binary.NativeEndian.Uint64(v)), nil
	case 4:
		return uint(binary.NativeEndian.Uint32(v)), nil
	}
	return 0, fmt.Errorf("CK_ULONG attribute of %d bytes", len(v))
}

func readKeyAttrs(ctx *p11.Ctx, sh p11.SessionHandle, obj p11.ObjectHandle) (keyAttrs, error) {
	attrs, err := ctx.GetAttributeValue(sh, obj, []*p11.Attribute{
		p11.NewAttribute(p11.CKA_KEY_TYPE, nil),
		p11.NewAttribute(p11.CKA_SENSITIVE, nil),
		p11.NewAttribute(p11.CKA_EXTRACTABLE, nil),
		p11.NewAttribute(p11.CKA_ALWAYS_AUTHENTICATE, nil),
		p11.NewAttribute(p11.CKA_SIGN, nil),
		p11.NewAttribute(p11.CKA_ID, nil),
		p11.NewAttribute(p11.CKA_LABEL, nil),
	})
	if err != nil {
		return keyAttrs{}, wrap("C_GetAttributeValue(private key)", err)
	}
	var ka keyAttrs
	for _, a := range attrs {
		switch a.Type {
		case p11.CKA_KEY_TYPE:
			ka.keyType, err = attrUint(a.Value)
			if err != nil {
				return keyAttrs{}, fmt.Errorf("pkcs11: CKA_KEY_TYPE: %w", err)
			}
		case p11.CKA_SENSITIVE:
			ka.sensitive = attrBool(a.Value)
		case p11.CKA_EXTRACTABLE:
			ka.extractable = attrBool(a.Value)
		case p11.CKA_ALWAYS_AUTHENTICATE:
			ka.alwaysAuth = attrBool(a.Value)
		case p11.CKA_SIGN:
			ka.canSign = attrBool(a.Value)
		case p11.CKA_ID:
			ka.id = a.Value
		case p11.CKA_LABEL:
			ka.label = string(a.Value)
		}
	}
	return ka, nil
}

// getAttr reads one attribute; one the token does not know
// (CKR_ATTRIBUTE_TYPE_INVALID) or will not reveal is returned as nil.
func getAttr(ctx *p11.Ctx, sh p11.SessionHandle, obj p11.ObjectHandle, typ uint) ([]byte, error) {
	a, err := ctx.GetAttributeValue(sh, obj, []*p11.Attribute{p11.NewAttribute(typ, nil)})
	if err != nil {
		if errors.Is(err, p11.Error(p11.CKR_ATTRIBUTE_TYPE_INVALID)) || errors.Is(err, p11.Error(p11.CKR_ATTRIBUTE_SENSITIVE)) {
			return nil, nil
		}
		return nil, err
	}
	return a[0].Value, nil
}

// findObjects returns the handles of the objects matching tmpl (at most
// maxObjectsPerFind: more is an ambiguity error for the caller anyway).
func findObjects(ctx *p11.Ctx, sh p11.SessionHandle, tmpl []*p11.Attribute) ([]p11.ObjectHandle, error) {
	if err := ctx.FindObjectsInit(sh, tmpl); err != nil {
		return nil, wrap("C_FindObjectsInit", err)
	}
	objs, _, err := ctx.FindObjects(sh, maxObjectsPerFind)
	ferr := ctx.FindObjectsFinal(sh)
	if err != nil {
		return nil, wrap("C_FindObjects", err)
	}
	if ferr != nil {
		return nil, wrap("C_FindObjectsFinal", ferr)
	}
	return objs, nil
}

// keyTemplate selects objects of class by the URI's id and object label.
func keyTemplate(class uint, id []byte, label string) []*p11.Attribute {
	t := []*p11.Attribute{p11.NewAttribute(p11.CKA_CLASS, class)}
	if id != nil {
		t = append(t, p11.NewAttribute(p11.CKA_ID, id))
	}
	if label != "" {
		t = append(t, p11.NewAttribute(p11.CKA_LABEL, label))
	}
	return t
}

// findPrivateKey returns the one private key the URI names.
func findPrivateKey(ctx *p11.Ctx, sh p11.SessionHandle, u *URI) (p11.ObjectHandle, error) {
	objs, err := findObjects(ctx, sh, keyTemplate(p11.CKO_PRIVATE_KEY, u.ID, u.Object))
	if err != nil {
		return 0, err
	}
	switch len(objs) {
	case 0:
		return 0, fmt.Errorf("pkcs11: no private key %s on token %q: %w", objectSelector(u), u.Token, signer.ErrKeyNotFound)
	case 1:
		return objs[0], nil
	}
	return 0, fmt.Errorf("pkcs11: %d private keys match %s on token %q; give both id= and object=", len(objs), objectSelector(u), u.Token)
}

func objectSelector(u *URI) string {
	c := URI{Object: u.Object, ID: u.ID}
	s := c.format(true)
	return s[len(Scheme)+1:]
}

// readPublicKey finds the public half of a private key: CKA_PUBLIC_KEY_INFO
// (PKCS#11 v2.40 §4.9) where the token has it, the RSA private key's own
// modulus and exponent, or else the public key object with the same
// CKA_ID (or label, when the key has no id).
func readPublicKey(ctx *p11.Ctx, sh p11.SessionHandle, priv p11.ObjectHandle, ka keyAttrs) (crypto.PublicKey, error) {
	spki, err := getAttr(ctx, sh, priv, p11.CKA_PUBLIC_KEY_INFO)
	if err != nil {
		return nil, wrap("C_GetAttributeValue(CKA_PUBLIC_KEY_INFO)", err)
	}
	if len(spki) > 0 {
		pub, err := x509.ParsePKIXPublicKey(spki)
		if err == nil {
			return checkPublic(pub, ka.keyType)
		}
		// Fall through: some tokens fill the attribute with junk.
	}
	if ka.keyType == p11.CKK_RSA {
		return rsaPublic(ctx, sh, priv)
	}
	var tmpl []*p11.Attribute
	switch {
	case len(ka.id) > 0:
		tmpl = keyTemplate(p11.CKO_PUBLIC_KEY, ka.id, "")
	case ka.label != "":
		tmpl = keyTemplate(p11.CKO_PUBLIC_KEY, nil, ka.label)
	default:
		return nil, errors.New("pkcs11: the private key has neither CKA_PUBLIC_KEY_INFO nor an id or label to find its public key by")
	}
	objs, err := findObjects(ctx, sh, tmpl)
	if err != nil {
		return nil, err
	}
	if len(objs) != 1 {
		return nil, fmt.Errorf("pkcs11: found %d public key objects for the private key (want exactly 1 with the same CKA_ID); import the public key with p11tool --write --load-pubkey", len(objs))
	}
	return ecPublic(ctx, sh, objs[0], ka.keyType)
}

func checkPublic(pub crypto.PublicKey, keyType uint) (crypto.PublicKey, error) {
	ok := false
	switch pub.(type) {
	case *rsa.PublicKey:
		ok = keyType == p11.CKK_RSA
	case *ecdsa.PublicKey:
		ok = keyType == p11.CKK_EC
	case ed25519.PublicKey:
		ok = keyType == ckkECEdwards
	}
	if !ok {
		return nil, fmt.Errorf("pkcs11: CKA_PUBLIC_KEY_INFO holds a %T, the key type is 0x%x", pub, keyType)
	}
	return pub, nil
}

func rsaPublic(ctx *p11.Ctx, sh p11.SessionHandle, obj p11.ObjectHandle) (crypto.PublicKey, error) {
	attrs, err := ctx.GetAttributeValue(sh, obj, []*p11.Attribute{
		p11.NewAttribute(p11.CKA_MODULUS, nil),
		p11.NewAttribute(p11.CKA_PUBLIC_EXPONENT, nil),
	})
	if err != nil {
		return nil, wrap("C_GetAttributeValue(CKA_MODULUS)", err)
	}
	n := new(big.Int).SetBytes(attrs[0].Value)
	e := new(big.Int).SetBytes(attrs[1].Value)
	if n.BitLen() < 2048 {
		return nil, fmt.Errorf("pkcs11: RSA key of %d bits is too weak for a CA (need 2048 or more): %w", n.BitLen(), signer.ErrUnsupportedAlgorithm)
	}
	if !e.IsInt64() || e.Int64() < 3 || e.Int64() > 1<<31-1 {
		return nil, fmt.Errorf("pkcs11: unsupported RSA public exponent: %w", signer.ErrUnsupportedAlgorithm)
	}
	return &rsa.PublicKey{N: n, E: int(e.Int64())}, nil
}

// ecPublic decodes an EC or Edwards public key object. CKA_EC_POINT is a
// DER OCTET STRING (PKCS#11 v2.40 §2.3.3), though some tokens store the
// raw point: accept both.
func ecPublic(ctx *p11.Ctx, sh p11.SessionHandle, obj p11.ObjectHandle, keyType uint) (crypto.PublicKey, error) {
	attrs, err := ctx.GetAttributeValue(sh, obj, []*p11.Attribute{
		p11.NewAttribute(p11.CKA_EC_PARAMS, nil),
		p11.NewAttribute(p11.CKA_EC_POINT, nil),
	})
	if err != nil {
		return nil, wrap("C_GetAttributeValue(CKA_EC_POINT)", err)
	}
	params, point := attrs[0].Value, attrs[1].Value
	var inner []byte
	if rest, err := asn1.Unmarshal(point, &inner); err == nil && len(rest) == 0 {
		point = inner
	}
	switch keyType {
	case ckkECEdwards:
		if !isEd25519Params(params) {
			return nil, fmt.Errorf("pkcs11: Edwards curve other than Ed25519: %w", signer.ErrUnsupportedAlgorithm)
		}
		if len(point) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("pkcs11: Ed25519 public key of %d bytes", len(point))
		}
		return ed25519.PublicKey(bytes.Clone(point)), nil
	case p11.CKK_EC:
		curve, ok := curveFromParams(params)
		if !ok {
			return nil, fmt.Errorf("pkcs11: EC key on a curve other than P-256, P-384, P-521: %w", signer.ErrUnsupportedAlgorithm)
		}
		pub, err := ecdsa.ParseUncompressedPublicKey(curve, point)
		if err != nil {
			return nil, fmt.Errorf("pkcs11: CKA_EC_POINT: %w", err)
		}
		return pub, nil
	}
	return nil, fmt.Errorf("pkcs11: key type 0x%x: %w", keyType, signer.ErrUnsupportedAlgorithm)
}

// privateKeyTemplate is the attribute set every key this backend creates
// gets (PKCS#11 v2.40 §4.9): on the token, private, sensitive, not
// extractable, for signing only. Encryption usages are switched off only
// for RSA (rsaNoCrypt): EC and Edwards keys have no encrypt, decrypt,
// wrap or unwrap mechanism (v2.40 §2.3, v3.0 §2.3.6), and tpm2-pkcs11
// refuses an EC template that mentions them (CKR_GENERAL_ERROR).
func privateKeyTemplate(id []byte, label string) []*p11.Attribute {
	t := []*p11.Attribute{
		p11.NewAttribute(p11.CKA_TOKEN, true),
		p11.NewAttribute(p11.CKA_PRIVATE, true),
		p11.NewAttribute(p11.CKA_SENSITIVE, true),
		p11.NewAttribute(p11.CKA_EXTRACTABLE, false),
		p11.NewAttribute(p11.CKA_SIGN, true),
		p11.NewAttribute(p11.CKA_DERIVE, false),
		p11.NewAttribute(p11.CKA_ID, id),
	}
	if label != "" {
		t = append(t, p11.NewAttribute(p11.CKA_LABEL, label))
	}
	return t
}

func publicKeyTemplate(id []byte, label string) []*p11.Attribute {
	t := []*p11.Attribute{
		p11.NewAttribute(p11.CKA_TOKEN, true),
		p11.NewAttribute(p11.CKA_PRIVATE, false),
		p11.NewAttribute(p11.CKA_VERIFY, true),
		p11.NewAttribute(p11.CKA_ID, id),
	}
	if label != "" {
		t = append(t, p11.NewAttribute(p11.CKA_LABEL, label))
	}
	return t
}

// rsaNoCrypt switches off the encryption usages of an RSA key pair, which
// a sign-only CA key must not have: the public and the private parts.
func rsaNoCrypt() (pub, priv []*p11.Attribute) {
	return []*p11.Attribute{
			p11.NewAttribute(p11.CKA_ENCRYPT, false),
			p11.NewAttribute(p11.CKA_WRAP, false),
		}, []*p11.Attribute{
			p11.NewAttribute(p11.CKA_DECRYPT, false),
			p11.NewAttribute(p11.CKA_UNWRAP, false),
		}
}

// generateParams returns the mechanism and the algorithm-specific public
// and private template parts for alg.
func generateParams(alg signer.Algorithm) (*p11.Mechanism, []*p11.Attribute, []*p11.Attribute, error) {
	switch alg {
	case signer.ECDSAP256, signer.ECDSAP384:
		c := elliptic.P256()
		if alg == signer.ECDSAP384 {
			c = elliptic.P384()
		}
		return p11.NewMechanism(p11.CKM_EC_KEY_PAIR_GEN, nil),
			[]*p11.Attribute{p11.NewAttribute(p11.CKA_EC_PARAMS, paramsForCurve(c))}, nil, nil
	case signer.RSA2048, signer.RSA3072, signer.RSA4096:
		bits := map[signer.Algorithm]int{signer.RSA2048: 2048, signer.RSA3072: 3072, signer.RSA4096: 4096}[alg]
		pubNo, privNo := rsaNoCrypt()
		return p11.NewMechanism(p11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil),
			append([]*p11.Attribute{
				p11.NewAttribute(p11.CKA_MODULUS_BITS, bits),
				p11.NewAttribute(p11.CKA_PUBLIC_EXPONENT, big.NewInt(rsaPublicExponent).Bytes()),
			}, pubNo...), privNo, nil
	case signer.Ed25519:
		return p11.NewMechanism(ckmECEdwardsKeyPairGen, nil),
			[]*p11.Attribute{p11.NewAttribute(p11.CKA_EC_PARAMS, []byte(ed25519OIDDER))}, nil, nil
	}
	return nil, nil, nil, fmt.Errorf("pkcs11: %q: %w", alg, signer.ErrUnsupportedAlgorithm)
}

// importAttrs returns the key-specific attributes of the private and
// public key objects for key (PKCS#11 v2.40 §2.1.3, §2.3.4; v3.0 §2.3.6).
func importAttrs(key crypto.Signer) (priv, pub []*p11.Attribute, err error) {
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		params := paramsForCurve(k.Curve)
		if params == nil {
			return nil, nil, fmt.Errorf("pkcs11: ECDSA curve %s: %w", k.Curve.Params().Name, signer.ErrUnsupportedAlgorithm)
		}
		d, err := k.Bytes()
		if err != nil {
			return nil, nil, fmt.Errorf("pkcs11: encode EC private key: %w", err)
		}
		point, err := k.PublicKey.Bytes()
		if err != nil {
			return nil, nil, fmt.Errorf("pkcs11: encode EC public key: %w", err)
		}
		pointDER, err := asn1.Marshal(point)
		if err != nil {
			return nil, nil, fmt.Errorf("pkcs11: encode EC point: %w", err)
		}
		return []*p11.Attribute{
				p11.NewAttribute(p11.CKA_CLASS, p11.CKO_PRIVATE_KEY),
				p11.NewAttribute(p11.CKA_KEY_TYPE, p11.CKK_EC),
				p11.NewAttribute(p11.CKA_EC_PARAMS, params),
				p11.NewAttribute(p11.CKA_VALUE, d),
			}, []*p11.Attribute{
				p11.NewAttribute(p11.CKA_CLASS, p11.CKO_PUBLIC_KEY),
				p11.NewAttribute(p11.CKA_KEY_TYPE, p11.CKK_EC),
				p11.NewAttribute(p11.CKA_EC_PARAMS, params),
				p11.NewAttribute(p11.CKA_EC_POINT, pointDER),
			}, nil
	case *rsa.PrivateKey:
		if len(k.Primes) != 2 {
			return nil, nil, fmt.Errorf("pkcs11: multi-prime RSA keys cannot be imported: %w", signer.ErrUnsupportedAlgorithm)
		}
		if k.N.BitLen() < 2048 {
			return nil, nil, fmt.Errorf("pkcs11: RSA key of %d bits is too weak for a CA (need 2048 or more): %w", k.N.BitLen(), signer.ErrUnsupportedAlgorithm)
		}
		k.Precompute()
		e := big.NewInt(int64(k.E)).Bytes()
		pubNo, privNo := rsaNoCrypt()
		return append([]*p11.Attribute{
				p11.NewAttribute(p11.CKA_CLASS, p11.CKO_PRIVATE_KEY),
				p11.NewAttribute(p11.CKA_KEY_TYPE, p11.CKK_RSA),
				p11.NewAttribute(p11.CKA_MODULUS, k.N.Bytes()),
				p11.NewAttribute(p11.CKA_PUBLIC_EXPONENT, e),
				p11.NewAttribute(p11.CKA_PRIVATE_EXPONENT, k.D.Bytes()),
				p11.NewAttribute(p11.CKA_PRIME_1, k.Primes[0].Bytes()),
				p11.NewAttribute(p11.CKA_PRIME_2, k.Primes[1].Bytes()),
				p11.NewAttribute(p11.CKA_EXPONENT_1, k.Precomputed.Dp.Bytes()),
				p11.NewAttribute(p11.CKA_EXPONENT_2, k.Precomputed.Dq.Bytes()),
				p11.NewAttribute(p11.CKA_COEFFICIENT, k.Precomputed.Qinv.Bytes()),
			}, privNo...), append([]*p11.Attribute{
				p11.NewAttribute(p11.CKA_CLASS, p11.CKO_PUBLIC_KEY),
				p11.NewAttribute(p11.CKA_KEY_TYPE, p11.CKK_RSA),
				p11.NewAttribute(p11.CKA_MODULUS, k.N.Bytes()),
				p11.NewAttribute(p11.CKA_PUBLIC_EXPONENT, e),
			}, pubNo...), nil
	case ed25519.PrivateKey:
		if len(k) != ed25519.PrivateKeySize {
			return nil, nil, fmt.Errorf("pkcs11: Ed25519 private key of %d bytes", len(k))
		}
		pointDER, err := asn1.Marshal([]byte(k.Public().(ed25519.PublicKey)))
		if err != nil {
			return nil, nil, fmt.Errorf("pkcs11: encode Ed25519 point: %w", err)
		}
		return []*p11.Attribute{
				p11.NewAttribute(p11.CKA_CLASS, p11.CKO_PRIVATE_KEY),
				p11.NewAttribute(p11.CKA_KEY_TYPE, ckkECEdwards),
				p11.NewAttribute(p11.CKA_EC_PARAMS, []byte(ed25519OIDDER)),
				p11.NewAttribute(p11.CKA_VALUE, k.Seed()),
			}, []*p11.Attribute{
				p11.NewAttribute(p11.CKA_CLASS, p11.CKO_PUBLIC_KEY),
				p11.NewAttribute(p11.CKA_KEY_TYPE, ckkECEdwards),
				p11.NewAttribute(p11.CKA_EC_PARAMS, []byte(ed25519OIDDER)),
				p11.NewAttribute(p11.CKA_EC_POINT, pointDER),
			}, nil
	}
	return nil, nil, fmt.Errorf("pkcs11: cannot import a %T: %w", key, signer.ErrUnsupportedAlgorithm)
}
