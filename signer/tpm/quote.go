package tpm

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
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

// akTemplate is the attestation key: a restricted ECDSA P-256 signing
// primary in the owner hierarchy with a fixed template and empty unique,
// so that the same TPM derives the same key every time (from its owner
// seed) and its public key can be pinned once. Restricted: it signs only
// TPM-generated structures (quotes), never an arbitrary digest, so a
// quote it signed has TPM_GENERATED_VALUE that software could not forge.
func akTemplate() tpm2.TPMTPublic {
	return tpm2.TPMTPublic{
		Type:    tpm2.TPMAlgECC,
		NameAlg: tpm2.TPMAlgSHA256,
		ObjectAttributes: tpm2.TPMAObject{
			FixedTPM: true, FixedParent: true, SensitiveDataOrigin: true,
			UserWithAuth: true, NoDA: true, Restricted: true, SignEncrypt: true,
		},
		Parameters: p256ECDSAParms(),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
			X: tpm2.TPM2BECCParameter{Buffer: []byte{}},
			Y: tpm2.TPM2BECCParameter{Buffer: []byte{}},
		}),
	}
}

// Quote has the TPM that uri names quote the sha256 PCRs uri selects
// (pcrs=, default 7) with nonce, signed by the attestation key.
func (b *Backend) Quote(ctx context.Context, uri string, nonce []byte) (*Quote, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	if len(nonce) == 0 || len(nonce) > MaxNonce {
		return nil, fmt.Errorf("tpm: quote: the nonce must be 1 to %d bytes", MaxNonce)
	}
	var q *Quote
	err = b.withConn(ctx, u, b.reclaiming(u, func(t transport.TPM) error {
		var err error
		q, err = quote(t, u.PCRs, nonce)
		return err
	}))
	if err != nil {
		return nil, fmt.Errorf("tpm: quote: %w", err)
	}
	return q, nil
}

func quote(t transport.TPM, pcrs []int, nonce []byte) (*Quote, error) {
	ak, err := createAK(t)
	if err != nil {
		return nil, err
	}
	defer flush(t, ak.ObjectHandle)
	rsp, err := tpm2.Quote{
		SignHandle:     tpm2.AuthHandle{Handle: ak.ObjectHandle, Name: ak.Name, Auth: tpm2.PasswordAuth(nil)},
		QualifyingData: tpm2.TPM2BData{Buffer: nonce},
		InScheme:       tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgNull},
		PCRSelect:      pcrSelection(pcrs),
	}.Execute(t)
	if err != nil {
		return nil, fmt.Errorf("TPM2_Quote: %w", err)
	}
	// The values are read after the quote; the approver checks them
	// against the quoted digest, so a PCR extended in between is caught.
	vals, err := ReadPCRs(t, pcrs)
	if err != nil {
		return nil, err
	}
	akPub, err := akPublicKey(ak.OutPublic)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKIXPublicKey(akPub)
	if err != nil {
		return nil, err
	}
	return &Quote{
		PCRs: pcrs, PCRValues: hexValues(pcrs, vals), Nonce: hex.EncodeToString(nonce),
		Attest:    base64.StdEncoding.EncodeToString(rsp.Quoted.Bytes()),
		Signature: base64.StdEncoding.EncodeToString(tpm2.Marshal(rsp.Signature)),
		AKPublic:  base64.StdEncoding.EncodeToString(der),
	}, nil
}

func akPublicKey(p tpm2.TPM2BPublic) (*ecdsa.PublicKey, error) {
	pub, err := p.Contents()
	if err != nil {
		return nil, err
	}
	parms, err := pub.Parameters.ECCDetail()
	if err != nil {
		return nil, err
	}
	pt, err := pub.Unique.ECC()
	if err != nil {
		return nil, err
	}
	return tpm2.ECDSAPub(parms, pt)
}

// AttestationKey returns the public key of the TPM's attestation key
// (the same on every call on the same TPM, until its owner hierarchy is
// cleared), to pin with `policy quote --ak-out`.
func (b *Backend) AttestationKey(ctx context.Context, uri string) (*ecdsa.PublicKey, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	var pub *ecdsa.PublicKey
	err = b.withConn(ctx, u, b.reclaiming(u, func(t transport.TPM) error {
		ak, err := createAK(t)
		if err != nil {
			return err
		}
		defer flush(t, ak.ObjectHandle)
		pub, err = akPublicKey(ak.OutPublic)
		return err
	}))
	if err != nil {
		return nil, fmt.Errorf("tpm: attestation key: %w", err)
	}
	return pub, nil
}

func hexValues(pcrs []int, vals [][]byte) map[string]string {
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
	pcrs, err := ParsePCRs(pcrList(q.PCRs))
	if err != nil {
		return nil, nil, fmt.Errorf("quote: %w", err)
	}
	if len(q.PCRs) == 0 || !slices.Equal(pcrs, q.PCRs) {
		return nil, nil, errors.New("quote: pcrs must be distinct ascending sha256 PCRs")
	}
	if !bytes.Equal(tpm2.Marshal(info.PCRSelect), tpm2.Marshal(pcrSelection(pcrs))) {
		return nil, nil, errors.New("quote: the quoted PCR selection differs from the file's pcrs")
	}
	vals, err := Approval{PCRs: pcrs, PCRValues: q.PCRValues}.Values()
	if err != nil {
		return nil, nil, fmt.Errorf("quote: %w", err)
	}
	if !bytes.Equal(info.PCRDigest.Buffer, pcrDigestOf(vals)) {
		return nil, nil, errors.New("quote: the PCR values do not match the quoted digest (changed since the quote, or altered)")
	}
	return pcrs, vals, nil
}
