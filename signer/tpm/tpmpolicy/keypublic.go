package tpmpolicy

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
)

// KeyTemplate is the public area of a CA key. userWithAuth is clear so the
// empty auth value cannot bypass the policy, adminWithPolicy is set so the
// admin role (TPM2_ObjectChangeAuth, TPM2_Certify of the key) also needs
// the policy, which only ever allows TPM2_Sign. noDA is set because the
// key has no auth value to guess and a daemon retrying a refused policy
// must not lock the TPM out. The scheme is TPM_ALG_NULL so that each
// TPM2_Sign names its hash. Imported keys cannot be fixedTPM/fixedParent
// (Part 3 §13.3.1) and their sensitive data did not originate in the TPM.
func KeyTemplate(curve tpm2.TPMECCCurve, authPolicy []byte, imported bool) tpm2.TPMTPublic {
	return tpm2.TPMTPublic{
		Type:    tpm2.TPMAlgECC,
		NameAlg: tpm2.TPMAlgSHA256,
		ObjectAttributes: tpm2.TPMAObject{
			FixedTPM:            !imported,
			FixedParent:         !imported,
			SensitiveDataOrigin: !imported,
			UserWithAuth:        false,
			AdminWithPolicy:     true,
			NoDA:                true,
			SignEncrypt:         true,
		},
		AuthPolicy: tpm2.TPM2BDigest{Buffer: authPolicy},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
			Symmetric: tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull},
			Scheme:    tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgNull},
			CurveID:   curve,
			KDF:       tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{}),
	}
}

// CheckKeyPublic verifies that a public area found in a blob or at a handle
// is a key this backend would have made, and returns its public key.
func CheckKeyPublic(p *tpm2.TPMTPublic) (*ecdsa.PublicKey, error) {
	if p.Type != tpm2.TPMAlgECC {
		return nil, fmt.Errorf("key type %v is not ECC", p.Type)
	}
	a := p.ObjectAttributes
	if !a.SignEncrypt || a.Decrypt || a.Restricted {
		return nil, errors.New("key is not an unrestricted signing key")
	}
	if a.UserWithAuth {
		return nil, errors.New("key has userWithAuth set: its empty auth value would bypass the PCR policy; re-create it with this backend")
	}
	if p.NameAlg != tpm2.TPMAlgSHA256 || len(p.AuthPolicy.Buffer) != sha256.Size {
		return nil, errors.New("key has no sha256 authPolicy")
	}
	ecc, err := p.Parameters.ECCDetail()
	if err != nil {
		return nil, err
	}
	if ecc.CurveID != tpm2.TPMECCNistP256 && ecc.CurveID != tpm2.TPMECCNistP384 {
		return nil, fmt.Errorf("key curve %v is not P-256 or P-384", ecc.CurveID)
	}
	pt, err := p.Unique.ECC()
	if err != nil {
		return nil, err
	}
	pub, err := tpm2.ECDSAPub(ecc, pt)
	if err != nil {
		return nil, fmt.Errorf("key public point: %w", err)
	}
	return pub, nil
}
