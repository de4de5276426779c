//go:build cgo

package pkcs11

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/asn1"
	"fmt"
	"math/big"

	p11 "github.com/miekg/pkcs11"

	"github.com/steward-trustd/steward-trustd/signer"
)

// DigestInfo prefixes of RFC 8017 §9.2 note 1: CKM_RSA_PKCS signs the
// DER DigestInfo, not the bare digest.
var digestInfoPrefix = map[crypto.Hash][]byte{
	crypto.SHA256: {0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20},
	crypto.SHA384: {0x30, 0x41, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02, 0x05, 0x00, 0x04, 0x30},
	crypto.SHA512: {0x30, 0x51, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03, 0x05, 0x00, 0x04, 0x40},
}

// PSS hash and MGF1 mechanisms (PKCS#11 v2.40 §2.1.11).
var pssHash = map[crypto.Hash][2]uint{
	crypto.SHA256: {p11.CKM_SHA256, p11.CKG_MGF1_SHA256},
	crypto.SHA384: {p11.CKM_SHA384, p11.CKG_MGF1_SHA384},
	crypto.SHA512: {p11.CKM_SHA512, p11.CKG_MGF1_SHA512},
}

// signRequest is what goes to C_SignInit/C_Sign for one signature, and
// how to turn the token's answer into what crypto/x509 expects.
type signRequest struct {
	mech []*p11.Mechanism
	data []byte
	// ecdsaSize is the byte length of r (and s) for ECDSA keys, whose
	// PKCS#11 signature is the raw r||s (PKCS#11 v2.40 §2.3.1); 0 otherwise.
	ecdsaSize int
}

// newSignRequest maps (pub, digest, opts) to a mechanism. CheckOpts has
// already accepted them.
func newSignRequest(pub crypto.PublicKey, digest []byte, opts crypto.SignerOpts) (signRequest, error) {
	h := opts.HashFunc()
	switch k := pub.(type) {
	case ed25519.PublicKey:
		// CKM_EDDSA without parameters is pure Ed25519 over the whole
		// message (PKCS#11 v3.0 §2.3.14).
		return signRequest{mech: []*p11.Mechanism{p11.NewMechanism(ckmEdDSA, nil)}, data: digest}, nil
	case *ecdsa.PublicKey:
		// CKM_ECDSA signs a digest the caller made; a digest longer than
		// the group order is truncated by the token as by crypto/ecdsa
		// (SEC 1 §4.1.3 step 5).
		return signRequest{
			mech:      []*p11.Mechanism{p11.NewMechanism(p11.CKM_ECDSA, nil)},
			data:      digest,
			ecdsaSize: (k.Params().N.BitLen() + 7) / 8,
		}, nil
	case *rsa.PublicKey:
		if pss, ok := opts.(*rsa.PSSOptions); ok {
			salt := pss.SaltLength
			switch {
			case salt == rsa.PSSSaltLengthEqualsHash || salt == rsa.PSSSaltLengthAuto:
				// Auto lets the signer choose: the hash length is what
				// TLS 1.3 (RFC 8446 §4.2.3) requires and every verifier
				// accepts.
				salt = h.Size()
			case salt < 0:
				return signRequest{}, fmt.Errorf("%w: PSS salt length %d", signer.ErrInvalidOptions, salt)
			}
			hm := pssHash[h]
			params := p11.NewPSSParams(hm[0], hm[1], uint(salt))
			return signRequest{mech: []*p11.Mechanism{p11.NewMechanism(p11.CKM_RSA_PKCS_PSS, params)}, data: digest}, nil
		}
		data := append(append([]byte{}, digestInfoPrefix[h]...), digest...)
		return signRequest{mech: []*p11.Mechanism{p11.NewMechanism(p11.CKM_RSA_PKCS, nil)}, data: data}, nil
	}
	return signRequest{}, fmt.Errorf("pkcs11: key type %T: %w", pub, signer.ErrUnsupportedAlgorithm)
}

// finish converts the token's signature into the encoding crypto.Signer
// promises: ASN.1 DER ECDSA-Sig-Value (RFC 5480 §2.2 / RFC 3279 §2.2.3)
// for ECDSA, unchanged otherwise.
func (r signRequest) finish(sig []byte) ([]byte, error) {
	if r.ecdsaSize == 0 {
		return sig, nil
	}
	if len(sig) != 2*r.ecdsaSize {
		return nil, fmt.Errorf("pkcs11: ECDSA signature of %d bytes, want %d", len(sig), 2*r.ecdsaSize)
	}
	der, err := asn1.Marshal(struct{ R, S *big.Int }{
		new(big.Int).SetBytes(sig[:r.ecdsaSize]),
		new(big.Int).SetBytes(sig[r.ecdsaSize:]),
	})
	if err != nil {
		return nil, fmt.Errorf("pkcs11: encode ECDSA signature: %w", err)
	}
	return der, nil
}
