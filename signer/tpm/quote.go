package tpm

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"fmt"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

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
		Parameters: tpmpolicy.P256ECDSAParms(),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
			X: tpm2.TPM2BECCParameter{Buffer: []byte{}},
			Y: tpm2.TPM2BECCParameter{Buffer: []byte{}},
		}),
	}
}

// Quote has the TPM that uri names quote the sha256 PCRs uri selects
// (pcrs=, default 7) with nonce, signed by the attestation key.
func (b *Backend) Quote(ctx context.Context, uri string, nonce []byte) (*tpmpolicy.Quote, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	if len(nonce) == 0 || len(nonce) > tpmpolicy.MaxNonce {
		return nil, fmt.Errorf("tpm: quote: the nonce must be 1 to %d bytes", tpmpolicy.MaxNonce)
	}
	var q *tpmpolicy.Quote
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

func quote(t transport.TPM, pcrs []int, nonce []byte) (*tpmpolicy.Quote, error) {
	ak, err := createAK(t)
	if err != nil {
		return nil, err
	}
	defer flush(t, ak.ObjectHandle)
	rsp, err := tpm2.Quote{
		SignHandle:     tpm2.AuthHandle{Handle: ak.ObjectHandle, Name: ak.Name, Auth: tpm2.PasswordAuth(nil)},
		QualifyingData: tpm2.TPM2BData{Buffer: nonce},
		InScheme:       tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgNull},
		PCRSelect:      tpmpolicy.PCRSelection(pcrs),
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
	return &tpmpolicy.Quote{
		PCRs: pcrs, PCRValues: tpmpolicy.HexValues(pcrs, vals), Nonce: hex.EncodeToString(nonce),
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
