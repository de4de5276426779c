package tpmpolicy

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"encoding/asn1"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"time"

	"github.com/google/go-tpm/tpm2"
)

// ApprovalFile is an approval file: systemd's tpm2-pcr-signature.json
// shape (a "sha256" array of {pcrs, pkfp, pol, sig}) with our additions
// in each entry. It is not secret: only the authority can make one, and
// one only lets the key sign in the PCR state it names.
type ApprovalFile struct {
	SHA256 []Approval `json:"sha256"`
}

// Approval is one approved PCR state.
type Approval struct {
	// PCRs is the sha256 PCR selection of the approved state.
	PCRs []int `json:"pcrs"`
	// PKFP is the hex SHA-256 of the authority's DER SubjectPublicKeyInfo
	// (ours) or of its PKCS#1 RSAPublicKey (systemd-measure's); both are
	// accepted.
	PKFP string `json:"pkfp"`
	// Pol is the hex PolicyPCR digest (SHA-256 session) of the state; for
	// a revocable key, that digest extended with PolicyNV(counter <=
	// Epoch) (EpochPolicyDigest).
	Pol string `json:"pol"`
	// Epoch (revocable keys only) is the revocation epoch the approval
	// was written at: it satisfies the key while the key's NV counter is
	// at most Epoch. PCRPol is then the PolicyPCR digest alone, which
	// the signer compares with the session's.
	Epoch  uint64 `json:"epoch,omitempty"`
	PCRPol string `json:"pcrPol,omitempty"`
	// Sig is the base64 marshalled TPMT_SIGNATURE of the authority over
	// SHA-256(pol || ref); the raw RSASSA-PKCS1-v1_5 signature bytes
	// (systemd-measure's form) are accepted too.
	Sig string `json:"sig"`
	// Ref is the policyRef signed with pol: the key's (Binding.Ref).
	// systemd-measure writes none, which is the empty ref.
	Ref string `json:"ref"`
	// PCRValues are the approved values, hex by PCR index (informational:
	// the TPM checks pol, and a reader checks that these give pol).
	PCRValues map[string]string `json:"pcrValues,omitempty"`
	// ApprovedBy, Note and CreatedAt are informational; the TPM enforces
	// no time.
	ApprovedBy string    `json:"approvedBy,omitempty"`
	Note       string    `json:"note,omitempty"`
	CreatedAt  time.Time `json:"createdAt"`
}

// MaxApprovalFileSize bounds one approval file.
const MaxApprovalFileSize = 64 << 10

// ApprovalMeta is the informational part of a new approval.
type ApprovalMeta struct {
	// Epoch is the revocation epoch of an approval of a revocable key:
	// the counter's current value (what policy revoke left it at). It
	// must be given (counters start at 1) for such a key, and 0 for others.
	Epoch      uint64
	ApprovedBy string
	Note       string
	CreatedAt  time.Time
}

// SignApproval makes an approval of the sha256 PCR state pcrs = values
// (one 32-byte value per PCR, ascending) by the authority key, for a key
// with binding b: it signs b's policyRef, and refuses a selection b does
// not accept (another selection than a v2 key's, a resettable PCR).
func SignApproval(authority crypto.Signer, b Binding, pcrs []int, values [][]byte, meta ApprovalMeta) (*Approval, error) {
	a, err := NewAuthority(authority.Public())
	if err != nil {
		return nil, err
	}
	if err := b.check(pcrs); err != nil {
		return nil, fmt.Errorf("approval: %w", err)
	}
	pcrPol, err := PCRPolicyDigest(pcrs, values) // checks the selection as checkApproval does
	if err != nil {
		return nil, fmt.Errorf("approval: %w", err)
	}
	pol, err := approvedPolicy(b, pcrPol, meta.Epoch)
	if err != nil {
		return nil, fmt.Errorf("approval: %w", err)
	}
	sig, err := SignTPMT(authority, a, ApprovalDigest(pol, b.ref))
	if err != nil {
		return nil, fmt.Errorf("approval: the authority's signature: %w", err)
	}
	out := &Approval{
		PCRs: pcrs, PKFP: a.Fingerprint(), Pol: hex.EncodeToString(pol),
		Sig: base64.StdEncoding.EncodeToString(tpm2.Marshal(sig)), Ref: b.ref,
		PCRValues: HexValues(pcrs, values), ApprovedBy: meta.ApprovedBy, Note: meta.Note, CreatedAt: meta.CreatedAt.UTC(),
	}
	if b.Revocable() {
		out.Epoch, out.PCRPol = meta.Epoch, hex.EncodeToString(pcrPol)
	}
	return out, nil
}

// approvedPolicy is the policy an approval of binding b signs for the
// PolicyPCR digest pcrPol: pcrPol itself, or for a revocable key pcrPol
// extended with PolicyNV(counter <= epoch).
func approvedPolicy(b Binding, pcrPol []byte, epoch uint64) ([]byte, error) {
	switch {
	case b.Revocable() && epoch == 0:
		return nil, fmt.Errorf("the key's approvals are revocable (%s): give the revocation epoch to approve at (its counter's current value: steward-trustd-ceremony status, or the last policy revoke receipt)", b)
	case b.Revocable():
		return EpochPolicyDigest(pcrPol, b, epoch)
	case epoch != 0:
		return nil, fmt.Errorf("an epoch applies to a revocable key only; this key's policy is %s", b)
	}
	return pcrPol, nil
}

// SignTPMT signs digest with k and wraps the signature as the TPM wants
// it for TPM2_VerifySignature: ECDSA-SHA256 (r, s) for an ECC authority,
// RSASSA-PKCS1-v1_5-SHA256 for an RSA one (the scheme systemd-measure uses).
func SignTPMT(k crypto.Signer, a *Authority, digest []byte) (tpm2.TPMTSignature, error) {
	switch a.pub.(type) {
	case *ecdsa.PublicKey:
		der, err := k.Sign(rand.Reader, digest, crypto.SHA256)
		if err != nil {
			return tpm2.TPMTSignature{}, err
		}
		var rs struct{ R, S *big.Int }
		if rest, err := asn1.Unmarshal(der, &rs); err != nil || len(rest) != 0 {
			return tpm2.TPMTSignature{}, errors.New("the authority returned a malformed ECDSA signature")
		}
		return tpm2.TPMTSignature{SigAlg: tpm2.TPMAlgECDSA, Signature: tpm2.NewTPMUSignature(tpm2.TPMAlgECDSA, &tpm2.TPMSSignatureECC{
			Hash:       tpm2.TPMAlgSHA256,
			SignatureR: tpm2.TPM2BECCParameter{Buffer: rs.R.FillBytes(make([]byte, 32))},
			SignatureS: tpm2.TPM2BECCParameter{Buffer: rs.S.FillBytes(make([]byte, 32))},
		})}, nil
	default:
		sig, err := k.Sign(rand.Reader, digest, crypto.SHA256)
		if err != nil {
			return tpm2.TPMTSignature{}, err
		}
		return rsaSignature(sig), nil
	}
}

// verifyTPMT checks sig over digest with a's public key in software.
func verifyTPMT(a *Authority, digest []byte, sig tpm2.TPMTSignature) error {
	switch k := a.pub.(type) {
	case *ecdsa.PublicKey:
		e, err := sig.Signature.ECDSA()
		if err != nil || sig.SigAlg != tpm2.TPMAlgECDSA || e.Hash != tpm2.TPMAlgSHA256 {
			return errors.New("signature is not ECDSA-SHA256")
		}
		r, s := new(big.Int).SetBytes(e.SignatureR.Buffer), new(big.Int).SetBytes(e.SignatureS.Buffer)
		if !ecdsa.Verify(k, digest, r, s) {
			return errors.New("the authority's signature does not verify")
		}
	case *rsa.PublicKey:
		e, err := sig.Signature.RSASSA()
		if err != nil || sig.SigAlg != tpm2.TPMAlgRSASSA || e.Hash != tpm2.TPMAlgSHA256 {
			return errors.New("signature is not RSASSA-SHA256")
		}
		if err := rsa.VerifyPKCS1v15(k, crypto.SHA256, digest, e.Sig.Buffer); err != nil {
			return errors.New("the authority's signature does not verify")
		}
	default:
		return errors.New("unsupported authority key")
	}
	return nil
}

// MarshalApprovals encodes approvals as an approval file.
func MarshalApprovals(as ...*Approval) ([]byte, error) {
	f := ApprovalFile{}
	for _, a := range as {
		f.SHA256 = append(f.SHA256, *a)
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// CheckedApproval is an approval verified in software against one of the
// key's authorities: what the signer tries in the TPM.
type CheckedApproval struct {
	File      string
	PCRs      []int
	Pol       []byte
	Ref       string // the key's policyRef, checked; what VerifySignature and PolicyAuthorize name
	Sig       tpm2.TPMTSignature
	Auth      int // index into the key's authorities
	CreatedAt time.Time
	// PCRPol is the PolicyPCR digest the session must reach: Pol, or for
	// a revocable key the digest before PolicyNV(counter <= Epoch).
	PCRPol []byte
	Epoch  uint64
}

// ParseApprovals decodes an approval file and checks each entry against
// auths and the key's binding b: the ref and PCR selection, that pkfp
// names one of auths, that the signature over SHA-256(pol || ref)
// verifies, and that pcrValues (if given) give pol. An entry for another
// authority is an error: an approval that cannot unlock this key is a
// mistake worth a log line.
func ParseApprovals(file string, data []byte, auths []*Authority, b Binding) ([]CheckedApproval, error) {
	if len(data) > MaxApprovalFileSize {
		return nil, fmt.Errorf("larger than %d bytes", MaxApprovalFileSize)
	}
	var f ApprovalFile
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("not an approval file: %w", err)
	}
	if len(f.SHA256) == 0 {
		return nil, errors.New(`no "sha256" approvals`)
	}
	out := make([]CheckedApproval, 0, len(f.SHA256))
	for i, a := range f.SHA256 {
		c, err := checkApproval(a, auths, b)
		if err != nil {
			return nil, fmt.Errorf("sha256[%d]: %w", i, err)
		}
		c.File = file
		out = append(out, c)
	}
	return out, nil
}

// checkApproval verifies one approval entry against auths and the key's
// binding b.
func checkApproval(a Approval, auths []*Authority, b Binding) (CheckedApproval, error) {
	if a.Ref != b.ref {
		return CheckedApproval{}, fmt.Errorf("ref %q is not this key's policyRef %q (key policy %s)", a.Ref, b.ref, b)
	}
	if len(a.PCRs) == 0 || !slices.IsSorted(a.PCRs) {
		return CheckedApproval{}, fmt.Errorf("pcrs %v: want distinct ascending sha256 PCRs 0-%d", a.PCRs, MaxPCR)
	}
	if err := b.check(a.PCRs); err != nil {
		return CheckedApproval{}, err
	}
	pol, err := hex.DecodeString(a.Pol)
	if err != nil || len(pol) != 32 {
		return CheckedApproval{}, errors.New("pol is not a hex SHA-256 digest")
	}
	// An ECC authority has no systemd fingerprint (""): an empty pkfp
	// must not match it.
	idx := slices.IndexFunc(auths, func(x *Authority) bool { return a.PKFP != "" && (x.fp == a.PKFP || x.systemdFP == a.PKFP) })
	if idx < 0 {
		return CheckedApproval{}, fmt.Errorf("signed by %s, which is not an authority of this key", a.PKFP)
	}
	sig, err := decodeSignature(auths[idx], a.Sig)
	if err != nil {
		return CheckedApproval{}, err
	}
	if err := verifyTPMT(auths[idx], ApprovalDigest(pol, a.Ref), sig); err != nil {
		return CheckedApproval{}, err
	}
	pcrPol, err := checkEpoch(a, b, pol)
	if err != nil {
		return CheckedApproval{}, err
	}
	if err := checkPCRValues(a, pcrPol); err != nil {
		return CheckedApproval{}, err
	}
	return CheckedApproval{PCRs: a.PCRs, Pol: pol, Ref: b.ref, Sig: sig, Auth: idx, CreatedAt: a.CreatedAt, PCRPol: pcrPol, Epoch: a.Epoch}, nil
}

// checkEpoch checks an approval's epoch fields against the key's binding
// and returns its PolicyPCR digest: pol itself, or for a revocable key
// pcrPol, checked to give pol with PolicyNV(counter <= epoch).
func checkEpoch(a Approval, b Binding, pol []byte) ([]byte, error) {
	if !b.Revocable() {
		if a.Epoch != 0 || a.PCRPol != "" {
			return nil, fmt.Errorf("epoch and pcrPol apply to a revocable key; this key's policy is %s", b)
		}
		return pol, nil
	}
	pcrPol, err := hex.DecodeString(a.PCRPol)
	if err != nil || len(pcrPol) != 32 || a.Epoch == 0 {
		return nil, errors.New("an approval of a revocable key needs epoch (> 0) and pcrPol (hex PolicyPCR digest)")
	}
	want, err := approvedPolicy(b, pcrPol, a.Epoch)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(want, pol) {
		return nil, fmt.Errorf("pcrPol with PolicyNV(counter 0x%08x <= epoch %d) does not give pol", uint32(b.nv), a.Epoch)
	}
	return pcrPol, nil
}

// decodeSignature decodes an approval's sig: a marshalled TPMT_SIGNATURE
// (ours), or, for an RSA authority, the raw RSASSA-PKCS1-v1_5 signature
// over SHA-256 that systemd-measure writes (exactly the modulus size; a
// TPMT_SIGNATURE is 6 bytes longer).
func decodeSignature(a *Authority, s string) (tpm2.TPMTSignature, error) {
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return tpm2.TPMTSignature{}, errors.New("sig is not base64")
	}
	if k, ok := a.pub.(*rsa.PublicKey); ok && len(raw) == k.Size() {
		return rsaSignature(raw), nil
	}
	sig, err := tpm2.Unmarshal[tpm2.TPMTSignature](raw)
	if err != nil {
		return tpm2.TPMTSignature{}, fmt.Errorf("sig is not a TPMT_SIGNATURE nor a raw RSA signature: %w", err)
	}
	return *sig, nil
}

// rsaSignature wraps a raw RSASSA-PKCS1-v1_5-SHA256 signature for the TPM.
func rsaSignature(sig []byte) tpm2.TPMTSignature {
	return tpm2.TPMTSignature{SigAlg: tpm2.TPMAlgRSASSA, Signature: tpm2.NewTPMUSignature(tpm2.TPMAlgRSASSA, &tpm2.TPMSSignatureRSA{
		Hash: tpm2.TPMAlgSHA256, Sig: tpm2.TPM2BPublicKeyRSA{Buffer: sig},
	})}
}

// checkPCRValues checks that the informational pcrValues, if present,
// are the state pol approves, so that what a human reads is what the TPM
// enforces.
func checkPCRValues(a Approval, pol []byte) error {
	if len(a.PCRValues) == 0 {
		return nil
	}
	vals, err := a.Values()
	if err != nil {
		return err
	}
	got, err := PCRPolicyDigest(a.PCRs, vals)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, pol) {
		return errors.New("pcrValues do not give pol")
	}
	return nil
}

// Values returns the approval's pcrValues in PCR order.
func (a Approval) Values() ([][]byte, error) {
	if len(a.PCRValues) != len(a.PCRs) {
		return nil, errors.New("pcrValues must name exactly the approved PCRs")
	}
	out := make([][]byte, len(a.PCRs))
	for i, p := range a.PCRs {
		v, err := hex.DecodeString(a.PCRValues[strconv.Itoa(p)])
		if err != nil || len(v) != 32 {
			return nil, fmt.Errorf("pcrValues[%d] is not a hex sha256 value", p)
		}
		out[i] = v
	}
	return out, nil
}
