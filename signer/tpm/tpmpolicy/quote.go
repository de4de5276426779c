package tpmpolicy

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"

	"github.com/google/go-tpm/tpm2"
)

// Quote is a TPM2_Quote (TPM 2.0 Part 3 §18.4) over a key's PCR selection
// with an approver's nonce, as JSON: what `policy quote` writes on the
// node and `policy approve --from-quote` checks.
type Quote struct {
	PCRs      []int             `json:"pcrs"`
	PCRValues map[string]string `json:"pcrValues"`
	Nonce     string            `json:"nonce"`
	// Attest is the base64 TPMS_ATTEST the TPM signed; Signature the base64
	// TPMT_SIGNATURE (ECDSA-SHA256) by the attestation key.
	Attest    string `json:"attest"`
	Signature string `json:"signature"`
	// AKPublic is the base64 DER public key of the attestation key, for
	// information only: the approver checks against the AK pinned once
	// (policy quote --ak-out), never against this field.
	AKPublic string `json:"akPublic"`
}

// MaxNonce bounds a quote nonce (TPM2B_DATA of a SHA-256 TPM).
const MaxNonce = 32

// HexValues renders PCR values as an approval or quote writes them: hex
// by PCR index.
func HexValues(pcrs []int, vals [][]byte) map[string]string {
	out := make(map[string]string, len(pcrs))
	for i, p := range pcrs {
		out[strconv.Itoa(p)] = hex.EncodeToString(vals[i])
	}
	return out
}

// VerifyQuote checks q against the pinned attestation key ak and the
// approver's nonce, and returns the quoted PCR state: the signature must
// be ak's over the attest structure, which must be TPM-generated
// (TPM_GENERATED_VALUE: a restricted key signs nothing else), a quote,
// carry nonce, select exactly q's sha256 PCRs, and its PCR digest must be
// that of q's values.
func VerifyQuote(q *Quote, ak *ecdsa.PublicKey, nonce []byte) ([]int, [][]byte, error) {
	attestBytes, err := base64.StdEncoding.DecodeString(q.Attest)
	if err != nil {
		return nil, nil, errors.New("quote: attest is not base64")
	}
	if err := verifyAKSignature(q, ak, attestBytes); err != nil {
		return nil, nil, err
	}
	attest, err := tpm2.Unmarshal[tpm2.TPMSAttest](attestBytes)
	if err != nil {
		return nil, nil, fmt.Errorf("quote: not a TPM-generated attest structure: %w", err)
	}
	if attest.Magic != tpm2.TPMGeneratedValue || attest.Type != tpm2.TPMSTAttestQuote {
		return nil, nil, errors.New("quote: not a TPM-generated quote")
	}
	if !bytes.Equal(attest.ExtraData.Buffer, nonce) {
		return nil, nil, errors.New("quote: the nonce differs from yours (a replayed or foreign quote); make a new quote with your nonce")
	}
	return quotedState(q, attest)
}

func verifyAKSignature(q *Quote, ak *ecdsa.PublicKey, attest []byte) error {
	raw, err := base64.StdEncoding.DecodeString(q.Signature)
	if err != nil {
		return errors.New("quote: signature is not base64")
	}
	sig, err := tpm2.Unmarshal[tpm2.TPMTSignature](raw)
	if err != nil {
		return fmt.Errorf("quote: signature: %w", err)
	}
	e, err := sig.Signature.ECDSA()
	if err != nil || sig.SigAlg != tpm2.TPMAlgECDSA || e.Hash != tpm2.TPMAlgSHA256 {
		return errors.New("quote: the signature is not ECDSA-SHA256")
	}
	d := sha256.Sum256(attest)
	if !ecdsa.Verify(ak, d[:], new(big.Int).SetBytes(e.SignatureR.Buffer), new(big.Int).SetBytes(e.SignatureS.Buffer)) {
		return errors.New("quote: not signed by the pinned attestation key (another TPM, or altered)")
	}
	return nil
}

// quotedState checks q's selection and values against the quote.
func quotedState(q *Quote, attest *tpm2.TPMSAttest) ([]int, [][]byte, error) {
	info, err := attest.Attested.Quote()
	if err != nil {
		return nil, nil, fmt.Errorf("quote: %w", err)
	}
	pcrs, err := ParsePCRs(PCRList(q.PCRs))
	if err != nil {
		return nil, nil, fmt.Errorf("quote: %w", err)
	}
	if len(q.PCRs) == 0 || !slices.Equal(pcrs, q.PCRs) {
		return nil, nil, errors.New("quote: pcrs must be distinct ascending sha256 PCRs")
	}
	if !bytes.Equal(tpm2.Marshal(info.PCRSelect), tpm2.Marshal(PCRSelection(pcrs))) {
		return nil, nil, errors.New("quote: the quoted PCR selection differs from the file's pcrs")
	}
	vals, err := Approval{PCRs: pcrs, PCRValues: q.PCRValues}.Values()
	if err != nil {
		return nil, nil, fmt.Errorf("quote: %w", err)
	}
	if !bytes.Equal(info.PCRDigest.Buffer, PCRDigest(vals)) {
		return nil, nil, errors.New("quote: the PCR values do not match the quoted digest (changed since the quote, or altered)")
	}
	return pcrs, vals, nil
}
