package tpm

import (
	"bytes"
	"encoding/asn1"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
)

// The key blob file is the "TSS2 PRIVATE KEY" PEM of the ASN.1 Specification
// for TPM 2.0 Key Files (draft-bottomley-tpm2-keys), as written and read by
// openssl_tpm2_engine and the tpm2 OpenSSL provider:
//
//	TPMKey ::= SEQUENCE {
//	    type        OBJECT IDENTIFIER,            -- 2.23.133.10.1.3 loadable key
//	    emptyAuth   [0] EXPLICIT BOOLEAN OPTIONAL,
//	    policy      [1] EXPLICIT SEQUENCE OF TPMPolicy OPTIONAL,
//	    secret      [2] EXPLICIT OCTET STRING OPTIONAL,
//	    authPolicy  [3] EXPLICIT SEQUENCE OF TPMAuthPolicy OPTIONAL,
//	    description [4] EXPLICIT UTF8String OPTIONAL,
//	    rsaParent   [5] EXPLICIT BOOLEAN OPTIONAL,
//	    parent      INTEGER,                      -- 0x40000001: ECC P-256 SRK (H-2 template)
//	    pubkey      OCTET STRING,                 -- TPM2B_PUBLIC
//	    privkey     OCTET STRING }                -- TPM2B_PRIVATE, encrypted to the SRK
//	TPMPolicy ::= SEQUENCE {
//	    commandCode   [0] EXPLICIT INTEGER,
//	    commandPolicy [1] EXPLICIT OCTET STRING }
//
// The policy list is exactly TPM2_PolicyPCR (commandPolicy = TPML_PCR_SELECTION
// || pcrDigest, as openssl_tpm2_engine marshals it) followed by
// TPM2_PolicyCommandCode (commandPolicy = the 4-byte TPM_CC_Sign).

// pemType is the PEM block type of a key blob file.
const pemType = "TSS2 PRIVATE KEY"

// oidLoadableKey identifies a key blob that TPM2_Load takes directly.
var oidLoadableKey = asn1.ObjectIdentifier{2, 23, 133, 10, 1, 3}

type asnPolicy struct {
	CommandCode   int    `asn1:"explicit,tag:0"`
	CommandPolicy []byte `asn1:"explicit,tag:1"`
}

type asnKey struct {
	Type        asn1.ObjectIdentifier
	EmptyAuth   bool          `asn1:"optional,explicit,tag:0"`
	Policy      []asnPolicy   `asn1:"optional,explicit,tag:1"`
	Secret      []byte        `asn1:"optional,explicit,tag:2"`
	AuthPolicy  asn1.RawValue `asn1:"optional,explicit,tag:3"`
	Description string        `asn1:"optional,explicit,tag:4,utf8"`
	RSAParent   bool          `asn1:"optional,explicit,tag:5"`
	Parent      int64
	PubKey      []byte
	PrivKey     []byte
}

// keyBlob is a decoded key blob: what TPM2_Load needs plus the policy
// that reproduces the key's authPolicy.
type keyBlob struct {
	public  tpm2.TPM2BPublic
	private tpm2.TPM2BPrivate
	pcrs    []int
	// pcrDigest is the SHA-256 over the policy PCRs' values at creation.
	pcrDigest []byte
}

func (k *keyBlob) marshalPEM(description string) ([]byte, error) {
	sel := tpm2.Marshal(pcrSelection(k.pcrs))
	pcrPolicy := append(sel, k.pcrDigest...)
	cc := binary.BigEndian.AppendUint32(nil, uint32(tpm2.TPMCCSign))
	der, err := asn1.Marshal(asnKey{
		Type:      oidLoadableKey,
		EmptyAuth: true,
		Policy: []asnPolicy{
			{CommandCode: int(tpm2.TPMCCPolicyPCR), CommandPolicy: pcrPolicy},
			{CommandCode: int(tpm2.TPMCCPolicyCommandCode), CommandPolicy: cc},
		},
		Description: description,
		Parent:      int64(tpm2.TPMRHOwner),
		PubKey:      tpm2.Marshal(k.public),
		PrivKey:     tpm2.Marshal(k.private),
	})
	if err != nil {
		return nil, fmt.Errorf("encode key blob: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemType, Bytes: der}), nil
}

// parseKeyBlob decodes a key blob file and checks that its policy is the
// one this backend writes.
func parseKeyBlob(data []byte) (*keyBlob, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != pemType {
		return nil, fmt.Errorf("no %q PEM block", pemType)
	}
	var k asnKey
	rest, err := asn1.Unmarshal(block.Bytes, &k)
	if err != nil {
		return nil, fmt.Errorf("decode key blob: %w", err)
	}
	if len(rest) != 0 {
		return nil, errors.New("decode key blob: trailing data")
	}
	if !k.Type.Equal(oidLoadableKey) {
		return nil, fmt.Errorf("key blob type %v is not a loadable key (%v)", k.Type, oidLoadableKey)
	}
	if k.Parent != int64(tpm2.TPMRHOwner) || k.RSAParent {
		return nil, fmt.Errorf("key blob parent 0x%x is not the owner hierarchy's ECC SRK; this backend only loads keys under the TCG H-2 ECC P-256 SRK", k.Parent)
	}
	if len(k.Secret) != 0 || len(k.AuthPolicy.FullBytes) != 0 {
		return nil, errors.New("key blob uses an importable secret or signed authPolicy, which this backend does not support")
	}
	blob := &keyBlob{}
	pub, err := tpm2.Unmarshal[tpm2.TPM2BPublic](k.PubKey)
	if err != nil {
		return nil, fmt.Errorf("decode key blob public area: %w", err)
	}
	blob.public = *pub
	priv, err := tpm2.Unmarshal[tpm2.TPM2BPrivate](k.PrivKey)
	if err != nil {
		return nil, fmt.Errorf("decode key blob private area: %w", err)
	}
	blob.private = *priv
	if len(k.Policy) != 2 ||
		k.Policy[0].CommandCode != int(tpm2.TPMCCPolicyPCR) ||
		k.Policy[1].CommandCode != int(tpm2.TPMCCPolicyCommandCode) {
		return nil, errors.New("key blob policy is not PolicyPCR + PolicyCommandCode(TPM2_Sign)")
	}
	if cc := k.Policy[1].CommandPolicy; len(cc) != 4 || tpm2.TPMCC(binary.BigEndian.Uint32(cc)) != tpm2.TPMCCSign {
		return nil, errors.New("key blob PolicyCommandCode is not TPM2_Sign")
	}
	blob.pcrs, blob.pcrDigest, err = parsePCRPolicy(k.Policy[0].CommandPolicy)
	if err != nil {
		return nil, err
	}
	return blob, nil
}

// parsePCRPolicy splits a PolicyPCR commandPolicy into the sha256 PCR
// indices and the expected PCR digest.
func parsePCRPolicy(b []byte) ([]int, []byte, error) {
	const digestLen = 32
	if len(b) < digestLen+4 {
		return nil, nil, errors.New("key blob PolicyPCR is too short")
	}
	selBytes, digest := b[:len(b)-digestLen], b[len(b)-digestLen:]
	sel, err := tpm2.Unmarshal[tpm2.TPMLPCRSelection](selBytes)
	if err != nil {
		return nil, nil, fmt.Errorf("key blob PolicyPCR selection: %w", err)
	}
	if !bytes.Equal(tpm2.Marshal(*sel), selBytes) {
		return nil, nil, errors.New("key blob PolicyPCR selection has trailing data")
	}
	if len(sel.PCRSelections) != 1 || sel.PCRSelections[0].Hash != tpm2.TPMAlgSHA256 {
		return nil, nil, errors.New("key blob PolicyPCR must select one sha256 bank")
	}
	var pcrs []int
	for i, byt := range sel.PCRSelections[0].PCRSelect {
		for bit := 0; bit < 8; bit++ {
			if byt&(1<<bit) != 0 {
				pcrs = append(pcrs, i*8+bit)
			}
		}
	}
	if len(pcrs) == 0 {
		return nil, nil, errors.New("key blob PolicyPCR selects no PCR")
	}
	for _, p := range pcrs {
		if p > MaxPCR {
			return nil, nil, fmt.Errorf("key blob PolicyPCR selects PCR %d (max %d)", p, MaxPCR)
		}
	}
	return pcrs, append([]byte(nil), digest...), nil
}

// pcrSelection is the sha256 selection of pcrs.
func pcrSelection(pcrs []int) tpm2.TPMLPCRSelection {
	idx := make([]uint, len(pcrs))
	for i, p := range pcrs {
		idx[i] = uint(p)
	}
	return tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{{
		Hash:      tpm2.TPMAlgSHA256,
		PCRSelect: tpm2.PCClientCompatible.PCRs(idx...),
	}}}
}
