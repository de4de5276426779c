package tpmpolicy

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"slices"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/signer"
)

// PolicyRef is the policyRef of the PolicyAuthorize in the policy of a v1
// key (made before the PCR selection was bound; see binding.go), and so
// part of what an authority signed for it: it separates our approvals from
// any other use of the same authority key (a systemd disk-unlock signature
// has an empty ref). New keys name a v2 ref (BindingForPCRs).
const PolicyRef = "steward-trustd/os-ca/v1"

// MaxAuthorities bounds the authorities of one key: PolicyOR takes at most
// eight branches (TPM 2.0 Part 3 §23.6).
const MaxAuthorities = 8

// Authority is a key that approves PCR states for a TPM key: the key's
// policy names it, and a PCR state it signed lets the key sign. It never
// needs a TPM; it is a file: or pkcs11: key on another machine.
type Authority struct {
	pub       crypto.PublicKey
	public    tpm2.TPMTPublic
	name      tpm2.TPM2BName
	fp        string
	systemdFP string // "" for an ECC authority
}

// NewAuthority describes pub (ECDSA P-256 or RSA 2048-4096) as an authority.
// Its TPM public area is canonical, so its name (in the key policy) is a
// function of the public key alone: ECC P-256 sign|userWithAuth with
// scheme ECDSA-SHA256; RSA as Talos's RSAPubKeyTemplate
// (decrypt|sign|userWithAuth, scheme NULL, the real exponent), so that a
// systemd/Talos PCR-signing key names the same.
func NewAuthority(pub crypto.PublicKey) (*Authority, error) {
	tmpl, err := authorityTemplate(pub)
	if err != nil {
		return nil, err
	}
	return authorityFromPublic(tmpl)
}

func authorityFromPublic(tmpl tpm2.TPMTPublic) (*Authority, error) {
	pub, err := publicKeyOf(&tmpl)
	if err != nil {
		return nil, err
	}
	canon, err := authorityTemplate(pub)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(tpm2.Marshal(canon), tpm2.Marshal(tmpl)) {
		return nil, fmt.Errorf("%w: policy authority public area is not the canonical template for its key", signer.ErrUnsupportedAlgorithm)
	}
	name, err := tpm2.ObjectName(&tmpl)
	if err != nil {
		return nil, fmt.Errorf("policy authority name: %w", err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("policy authority public key: %w", err)
	}
	sum := sha256.Sum256(der)
	a := &Authority{pub: pub, public: tmpl, name: *name, fp: hex.EncodeToString(sum[:])}
	if k, ok := pub.(*rsa.PublicKey); ok {
		s := sha256.Sum256(x509.MarshalPKCS1PublicKey(k))
		a.systemdFP = hex.EncodeToString(s[:])
	}
	return a, nil
}

// Public returns the authority's public key.
func (a *Authority) Public() crypto.PublicKey { return a.pub }

// Name is the authority's TPM name (nameAlg SHA-256 || SHA-256 of its
// public area), the value the key policy's PolicyAuthorize names.
func (a *Authority) Name() []byte { return append([]byte(nil), a.name.Buffer...) }

// Fingerprint is the hex SHA-256 of the authority's DER SubjectPublicKeyInfo:
// the "pkfp" of approvals (systemd-measure's definition).
func (a *Authority) Fingerprint() string { return a.fp }

// SystemdFingerprint is the "pkfp" systemd-measure writes for an RSA
// authority: the hex SHA-256 of its DER PKCS#1 RSAPublicKey (checked
// against systemd-measure 252's output). Empty for an ECC authority.
func (a *Authority) SystemdFingerprint() string { return a.systemdFP }

// String names the authority for messages.
func (a *Authority) String() string {
	return fmt.Sprintf("%s (name %s)", a.fp, hex.EncodeToString(a.name.Buffer))
}

func authorityTemplate(pub crypto.PublicKey) (tpm2.TPMTPublic, error) {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return tpm2.TPMTPublic{}, fmt.Errorf("%w: policy authority curve %s (want P-256 or RSA)", signer.ErrUnsupportedAlgorithm, k.Curve.Params().Name)
		}
		return eccAuthorityTemplate(k), nil
	case *rsa.PublicKey:
		if bits := k.N.BitLen(); bits < 2048 || bits > 4096 || bits%8 != 0 {
			return tpm2.TPMTPublic{}, fmt.Errorf("%w: policy authority RSA-%d (want 2048-4096 bits)", signer.ErrUnsupportedAlgorithm, bits)
		}
		return rsaAuthorityTemplate(k), nil
	}
	return tpm2.TPMTPublic{}, fmt.Errorf("%w: policy authority key %T (want ECDSA P-256 or RSA)", signer.ErrUnsupportedAlgorithm, pub)
}

func eccAuthorityTemplate(k *ecdsa.PublicKey) tpm2.TPMTPublic {
	point, _ := k.Bytes() //nolint:errcheck // a P-256 point from crypto/ecdsa always encodes
	return tpm2.TPMTPublic{
		Type:             tpm2.TPMAlgECC,
		NameAlg:          tpm2.TPMAlgSHA256,
		ObjectAttributes: tpm2.TPMAObject{SignEncrypt: true, UserWithAuth: true},
		Parameters:       P256ECDSAParms(),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
			X: tpm2.TPM2BECCParameter{Buffer: point[1:33]},
			Y: tpm2.TPM2BECCParameter{Buffer: point[33:]},
		}),
	}
}

// P256ECDSAParms are the parameters of a P-256 ECDSA-SHA256 signing key
// (the ECC authority template and the attestation key).
func P256ECDSAParms() tpm2.TPMUPublicParms {
	return tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
		Symmetric: tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull},
		Scheme: tpm2.TPMTECCScheme{
			Scheme:  tpm2.TPMAlgECDSA,
			Details: tpm2.NewTPMUAsymScheme(tpm2.TPMAlgECDSA, &tpm2.TPMSSigSchemeECDSA{HashAlg: tpm2.TPMAlgSHA256}),
		},
		CurveID: tpm2.TPMECCNistP256,
		KDF:     tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
	})
}

// rsaAuthorityTemplate is Talos's RSAPubKeyTemplate
// (internal/pkg/secureboot/tpm2/keys.go:46 in v1.14.1).
func rsaAuthorityTemplate(k *rsa.PublicKey) tpm2.TPMTPublic {
	return tpm2.TPMTPublic{
		Type:             tpm2.TPMAlgRSA,
		NameAlg:          tpm2.TPMAlgSHA256,
		ObjectAttributes: tpm2.TPMAObject{Decrypt: true, SignEncrypt: true, UserWithAuth: true},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgRSA, &tpm2.TPMSRSAParms{
			Symmetric: tpm2.TPMTSymDefObject{
				Algorithm: tpm2.TPMAlgNull,
				Mode:      tpm2.NewTPMUSymMode(tpm2.TPMAlgRSA, tpm2.TPMAlgNull),
			},
			Scheme: tpm2.TPMTRSAScheme{
				Scheme:  tpm2.TPMAlgNull,
				Details: tpm2.NewTPMUAsymScheme(tpm2.TPMAlgRSA, &tpm2.TPMSSigSchemeRSASSA{HashAlg: tpm2.TPMAlgNull}),
			},
			KeyBits:  tpm2.TPMKeyBits(k.N.BitLen()),
			Exponent: uint32(k.E), //nolint:gosec // crypto/rsa keeps E below 2^31
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgRSA, &tpm2.TPM2BPublicKeyRSA{Buffer: k.N.Bytes()}),
	}
}

// publicKeyOf decodes the public key of an authority's public area.
func publicKeyOf(p *tpm2.TPMTPublic) (crypto.PublicKey, error) {
	switch p.Type {
	case tpm2.TPMAlgECC:
		pt, err := p.Unique.ECC()
		if err != nil {
			return nil, fmt.Errorf("policy authority: %w", err)
		}
		raw := append(append([]byte{4}, pt.X.Buffer...), pt.Y.Buffer...)
		k, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), raw)
		if err != nil {
			return nil, fmt.Errorf("policy authority: %w", err)
		}
		return k, nil
	case tpm2.TPMAlgRSA:
		parms, err := p.Parameters.RSADetail()
		if err != nil {
			return nil, fmt.Errorf("policy authority: %w", err)
		}
		n, err := p.Unique.RSA()
		if err != nil {
			return nil, fmt.Errorf("policy authority: %w", err)
		}
		return tpm2.RSAPub(parms, n)
	}
	return nil, fmt.Errorf("%w: policy authority type %v", signer.ErrUnsupportedAlgorithm, p.Type)
}

// TPMName is Name as the TPM2B_NAME that PolicyAuthorize and
// TPM2_VerifySignature take.
func (a *Authority) TPMName() tpm2.TPM2BName { return a.name }

// PublicArea is the authority's canonical TPM public area, the one
// TPM2_LoadExternal loads to verify an approval's signature.
func (a *Authority) PublicArea() tpm2.TPMTPublic { return a.public }

// SameAuthorities reports whether a and b name the same keys in order.
func SameAuthorities(a, b []*Authority) bool {
	return slices.EqualFunc(a, b, func(x, y *Authority) bool { return x.fp == y.fp })
}
