package attestation

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/big"
	"slices"
	"time"

	"github.com/google/go-tpm/tpm2"
)

// Options is what the verifier expects of the evidence.
type Options struct {
	// EKRoots are the trusted EK certificate issuers. Required.
	EKRoots *EKRoots
	// QualifyingData is the value the attestation must carry in extraData:
	// the SHA-256 of the CSR (or of the auditor's challenge). Required.
	QualifyingData []byte
	// PublicKey is the key the attested key must be (the CSR's or CA
	// certificate's). Required.
	PublicKey crypto.PublicKey
	// AuthPolicies, when non-empty, are the accepted authPolicy digests
	// (e.g. a signed-policy key's PolicyAuthorize digest). When empty the
	// key must be PCR-bound: authPolicy = PolicyPCR(creation PCR
	// selection, creation PCR digest) → PolicyCommandCode(TPM2_Sign).
	AuthPolicies [][]byte
	// PCRDigest, when set, is the expected (golden) creation PCR digest.
	PCRDigest []byte
	// PCRs, when PCRDigest is not set, is the sha256 PCR selection the key
	// must have been created with (and, for a signed-policy key, bound in
	// its policyRef); nil means DefaultPCR alone. Callers check it with
	// tpm.ParsePCRs, which refuses software-resettable PCRs.
	PCRs []int
	// Now is the time the EK certificate must be valid at; zero means
	// time.Now().
	Now time.Time
}

// Result describes verified evidence, for receipts and reports.
type Result struct {
	EK EKInfo `json:"ek"`
	// AKName and KeyName are hex TPM names (nameAlg ‖ H(TPMT_PUBLIC)).
	AKName  string `json:"akName"`
	KeyName string `json:"keyName"`
	// PCRs and PCRDigest are the creation PCR selection and digest.
	PCRs      []int  `json:"pcrs,omitempty"`
	PCRDigest string `json:"pcrDigest,omitempty"`
	// Policy is the verified authPolicy digest (hex).
	Policy string `json:"policy"`
	// OutsideInfo is the label the key was created with.
	OutsideInfo string `json:"outsideInfo,omitempty"`
}

// verified carries the decoded parts between checks.
type verified struct {
	ek       *tpm2.TPMTPublic
	ak       *tpm2.TPMTPublic
	key      *tpm2.TPMTPublic
	creation *tpm2.TPMSCreationData
	res      Result
}

// Verify runs every Check on e, in order, and returns what it
// proved, or a *CheckError naming the first check that failed.
func Verify(e *Evidence, o Options) (*Result, error) {
	if len(o.QualifyingData) == 0 || o.PublicKey == nil {
		return nil, fmt.Errorf("attestation: verifier called without qualifying data or expected public key")
	}
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	ekCert, info, err := verifyEKCertificate(e.EKCertificate, e.EKChain, o.EKRoots, now)
	if err != nil {
		return nil, err
	}
	v := &verified{res: Result{EK: *info}}
	if v.ek, err = checkEKPublic(e.EKPublic, ekCert); err != nil {
		return nil, err
	}
	for _, step := range []func(*Evidence, Options, *verified) error{
		checkAK, checkAttestation, checkKey, checkPolicy, checkKeyMatch,
	} {
		if err := step(e, o, v); err != nil {
			return nil, err
		}
	}
	return &v.res, nil
}

// checkAK checks the AK public area: a restricted signing key that never
// leaves this TPM (fixedTPM, fixedParent, sensitiveDataOrigin) and
// cannot decrypt, so it signs only TPM-generated structures.
func checkAK(e *Evidence, _ Options, v *verified) error {
	ak, err := unmarshalPublic(e.AKPublic)
	if err != nil {
		return refuse(CheckAKPublic, "%w", err)
	}
	a := ak.ObjectAttributes
	if !a.FixedTPM || !a.FixedParent || !a.SensitiveDataOrigin || !a.Restricted || !a.SignEncrypt || a.Decrypt {
		return refuse(CheckAKPublic, "the AK is not a restricted fixedTPM|fixedParent|sensitiveDataOrigin signing key without decrypt")
	}
	if ak.Type != tpm2.TPMAlgECC || ak.NameAlg != tpm2.TPMAlgSHA256 {
		return refuse(CheckAKPublic, "the AK is not an ECC key with a sha256 name")
	}
	v.ak = ak
	v.res.AKName = hex.EncodeToString(nameOf(e.AKPublic))
	return nil
}

// checkAttestation checks the TPMS_ATTEST (Part 2 §10.12.12) and its
// signature by the AK.
func checkAttestation(e *Evidence, o Options, v *verified) error {
	if len(e.Attest) < 6 || !bytes.Equal(e.Attest[:4], []byte{0xff, 'T', 'C', 'G'}) {
		return refuse(CheckAttestFormat, "magic is not TPM_GENERATED_VALUE: not produced by a TPM")
	}
	if err := checkSignature(v.ak, e.Attest, e.Signature); err != nil {
		return err
	}
	att, err := tpm2.Unmarshal[tpm2.TPMSAttest](e.Attest)
	if err != nil {
		return refuse(CheckAttestFormat, "decode TPMS_ATTEST: %w", err)
	}
	if att.Type != tpm2.TPMSTAttestCreation {
		return refuse(CheckAttestFormat, "attestation type 0x%x is not TPM_ST_ATTEST_CREATION", uint16(att.Type))
	}
	if !bytes.Equal(att.ExtraData.Buffer, o.QualifyingData) {
		return refuse(CheckQualifyingData, "extraData %x is not the expected %x (evidence made for another request)", att.ExtraData.Buffer, o.QualifyingData)
	}
	ci, err := att.Attested.Creation()
	if err != nil {
		return refuse(CheckAttestFormat, "%w", err)
	}
	if !bytes.Equal(ci.ObjectName.Buffer, nameOf(e.KeyPublic)) {
		return refuse(CheckCertifiedName, "the certified object is not the presented key")
	}
	sum := sha256.Sum256(e.CreationData)
	if !bytes.Equal(ci.CreationHash.Buffer, sum[:]) {
		return refuse(CheckCreationHash, "creationHash differs from SHA-256 of the presented creation data")
	}
	return nil
}

// checkSignature verifies the AK's ECDSA signature over attest.
func checkSignature(ak *tpm2.TPMTPublic, attest, sig []byte) error {
	parms, err := ak.Parameters.ECCDetail()
	if err != nil {
		return refuse(CheckAKPublic, "%w", err)
	}
	pt, err := ak.Unique.ECC()
	if err != nil {
		return refuse(CheckAKPublic, "%w", err)
	}
	pub, err := tpm2.ECDSAPub(parms, pt)
	if err != nil {
		return refuse(CheckAKPublic, "%w", err)
	}
	s, err := tpm2.Unmarshal[tpm2.TPMTSignature](sig)
	if err != nil {
		return refuse(CheckAttestSig, "decode TPMT_SIGNATURE: %w", err)
	}
	ec, err := s.Signature.ECDSA()
	if err != nil || s.SigAlg != tpm2.TPMAlgECDSA || ec.Hash != tpm2.TPMAlgSHA256 {
		return refuse(CheckAttestSig, "the signature is not ECDSA with SHA-256")
	}
	digest := sha256.Sum256(attest)
	r, ss := new(big.Int).SetBytes(ec.SignatureR.Buffer), new(big.Int).SetBytes(ec.SignatureS.Buffer)
	if !ecdsa.Verify(pub, digest[:], r, ss) {
		return refuse(CheckAttestSig, "the AK's signature does not verify")
	}
	return nil
}

// checkKey checks the attested key's public area: created in the TPM
// (sensitiveDataOrigin), non-duplicable (fixedTPM, fixedParent), an
// unrestricted signing key that only its policy can use (userWithAuth
// clear, adminWithPolicy), P-256 or P-384.
func checkKey(e *Evidence, _ Options, v *verified) error {
	key, err := unmarshalPublic(e.KeyPublic)
	if err != nil {
		return refuse(CheckKeyAttributes, "%w", err)
	}
	a := key.ObjectAttributes
	switch {
	case !a.SensitiveDataOrigin:
		return refuse(CheckKeyAttributes, "sensitiveDataOrigin is clear: the key was made outside the TPM (imported)")
	case !a.FixedTPM || !a.FixedParent:
		return refuse(CheckKeyAttributes, "fixedTPM/fixedParent clear: the key can be duplicated to another TPM")
	case !a.SignEncrypt || a.Restricted || a.Decrypt:
		return refuse(CheckKeyAttributes, "the key is not an unrestricted sign-only key")
	case a.UserWithAuth || !a.AdminWithPolicy:
		return refuse(CheckKeyAttributes, "userWithAuth set or adminWithPolicy clear: something other than the policy can use the key")
	case key.Type != tpm2.TPMAlgECC || key.NameAlg != tpm2.TPMAlgSHA256:
		return refuse(CheckKeyAttributes, "the key is not an ECC key with a sha256 name")
	}
	cd, err := tpm2.Unmarshal[tpm2.TPMSCreationData](e.CreationData)
	if err != nil {
		return refuse(CheckCreationHash, "decode TPMS_CREATION_DATA: %w", err)
	}
	v.key, v.creation = key, cd
	v.res.KeyName = hex.EncodeToString(nameOf(e.KeyPublic))
	v.res.OutsideInfo = string(cd.OutsideInfo.Buffer)
	v.res.PCRs = selectedPCRs(cd.PCRSelect)
	v.res.PCRDigest = hex.EncodeToString(cd.PCRDigest.Buffer)
	return nil
}

// checkPolicy checks the key's authPolicy against the accepted digests,
// or, for a PCR-bound key, against PolicyPCR(creation selection, creation
// digest) → PolicyCommandCode(TPM2_Sign) (Part 3 §23.7, §23.11) recomputed
// here: the TPM recorded those PCRs when it created the key.
func checkPolicy(_ *Evidence, o Options, v *verified) error {
	got := v.key.AuthPolicy.Buffer
	v.res.Policy = hex.EncodeToString(got)
	if o.PCRDigest != nil && !bytes.Equal(o.PCRDigest, v.creation.PCRDigest.Buffer) {
		return refuse(CheckPCRDigest, "creation PCR digest %x is not the expected %x", v.creation.PCRDigest.Buffer, o.PCRDigest)
	}
	if want := expectedPCRs(o); o.PCRDigest == nil && !slices.Equal(v.res.PCRs, want) {
		return refuse(CheckPCRDigest, "the key was created over sha256 PCRs %v, not the expected %v: without a golden --pcr-digest the selection must be the expected one", v.res.PCRs, want)
	}
	if len(o.AuthPolicies) > 0 {
		if !slices.ContainsFunc(o.AuthPolicies, func(p []byte) bool { return bytes.Equal(p, got) }) {
			return refuse(CheckKeyPolicy, "authPolicy %x is none of the expected signed-policy digests", got)
		}
		return nil
	}
	if len(v.res.PCRs) == 0 {
		return refuse(CheckKeyPolicy, "the key was created without a PCR selection, so its PCR policy cannot be recomputed")
	}
	want, err := PCRPolicy(v.creation.PCRSelect, v.creation.PCRDigest.Buffer)
	if err != nil {
		return refuse(CheckKeyPolicy, "%w", err)
	}
	if !bytes.Equal(want, got) {
		return refuse(CheckKeyPolicy, "authPolicy %x is not PolicyPCR(creation PCRs) → CC(Sign) = %x", got, want)
	}
	return nil
}

// DefaultPCR is the creation PCR selection Verify expects when neither
// Options.PCRDigest nor Options.PCRs says otherwise: PCR 7, the Secure Boot
// state, the TPM backend's default.
const DefaultPCR = 7

func expectedPCRs(o Options) []int {
	if o.PCRs != nil {
		return o.PCRs
	}
	return []int{DefaultPCR}
}

// PCRPolicy is the digest of PolicyPCR(sel, pcrDigest) →
// PolicyCommandCode(TPM2_Sign) on a sha256 session.
func PCRPolicy(sel tpm2.TPMLPCRSelection, pcrDigest []byte) ([]byte, error) {
	pc, err := tpm2.NewPolicyCalculator(tpm2.TPMAlgSHA256)
	if err != nil {
		return nil, err
	}
	if err := (tpm2.PolicyPCR{PcrDigest: tpm2.TPM2BDigest{Buffer: pcrDigest}, Pcrs: sel}).Update(pc); err != nil {
		return nil, err
	}
	if err := (tpm2.PolicyCommandCode{Code: tpm2.TPMCCSign}).Update(pc); err != nil {
		return nil, err
	}
	return pc.Hash().Digest, nil
}

// checkKeyMatch checks that the attested key is the expected public key.
func checkKeyMatch(_ *Evidence, o Options, v *verified) error {
	parms, err := v.key.Parameters.ECCDetail()
	if err != nil {
		return refuse(CheckKeyAttributes, "%w", err)
	}
	if parms.CurveID != tpm2.TPMECCNistP256 && parms.CurveID != tpm2.TPMECCNistP384 {
		return refuse(CheckKeyAttributes, "the key's curve is not P-256 or P-384")
	}
	pt, err := v.key.Unique.ECC()
	if err != nil {
		return refuse(CheckKeyAttributes, "%w", err)
	}
	pub, err := tpm2.ECDSAPub(parms, pt)
	if err != nil {
		return refuse(CheckKeyAttributes, "%w", err)
	}
	want, ok := o.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !want.Equal(pub) {
		return refuse(CheckKeyMatch, "the attested key is not the request's public key")
	}
	return nil
}

// nameOf is the TPM name of a sha256-named public area: the nameAlg
// followed by SHA-256 of its TPMT_PUBLIC (Part 1 §16).
func nameOf(rawPublic []byte) []byte {
	sum := sha256.Sum256(rawPublic)
	return append([]byte{0x00, byte(tpm2.TPMAlgSHA256)}, sum[:]...)
}

// selectedPCRs lists the sha256 PCRs a selection names.
func selectedPCRs(sel tpm2.TPMLPCRSelection) []int {
	var out []int
	for _, s := range sel.PCRSelections {
		if s.Hash != tpm2.TPMAlgSHA256 {
			continue
		}
		for i, b := range s.PCRSelect {
			for bit := range 8 {
				if b&(1<<bit) != 0 {
					out = append(out, i*8+bit)
				}
			}
		}
	}
	return out
}
