package tpmpolicy

import (
	"bytes"
	"encoding/asn1"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"

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
// The policy list of a PCR-bound key is exactly TPM2_PolicyPCR
// (commandPolicy = TPML_PCR_SELECTION || pcrDigest, as openssl_tpm2_engine
// marshals it) followed by TPM2_PolicyCommandCode (commandPolicy = the
// 4-byte TPM_CC_Sign).
//
// A key under policy authorities (signed policies) follows the draft's
// rule that "the first policy statement MUST be TPM2_PolicyAuthorize":
// one TPM2_PolicyAuthorize per authority (commandPolicy = TPM2B_PUBLIC
// keySign || TPM2B_DIGEST policyRef || TPMT_SIGNATURE with sigAlg
// TPM_ALG_NULL, the empty signature), then TPM2_PolicyCommandCode(Sign),
// and, with two or more authorities, TPM2_PolicyOR (commandPolicy =
// TPML_DIGEST of the branches PolicyAuthorize(A_i) -> CC(Sign)). The
// draft defines no OR of signed policies; a single-authority blob is
// exactly the draft's encoding.

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

// KeyBlob is a decoded key blob: what TPM2_Load needs plus the policy
// that reproduces the key's authPolicy.
type KeyBlob struct {
	Public  tpm2.TPM2BPublic
	Private tpm2.TPM2BPrivate
	PCRs    []int
	// PCRDigest is the SHA-256 over the policy PCRs' values at creation.
	PCRDigest []byte
	// Authorities are the policy authorities of a key under signed
	// policies, and Binding the policyRef their PolicyAuthorize names
	// (with the PCR selection it binds); PCRDigest is then empty.
	Authorities []*Authority
	Binding     Binding
}

// authPolicy is the authPolicy the blob's policy list gives.
func (k *KeyBlob) AuthPolicy() ([]byte, error) {
	if len(k.Authorities) > 0 {
		p, _, err := AuthorizedPolicy(k.Authorities, k.Binding.Ref())
		return p, err
	}
	return PCRAuthPolicy(k.PCRs, k.PCRDigest)
}

// policyStatements is the blob's policy list.
func (k *KeyBlob) policyStatements() ([]asnPolicy, error) {
	cc := asnPolicy{CommandCode: int(tpm2.TPMCCPolicyCommandCode), CommandPolicy: binary.BigEndian.AppendUint32(nil, uint32(tpm2.TPMCCSign))}
	if len(k.Authorities) == 0 {
		sel := tpm2.Marshal(PCRSelection(k.PCRs))
		return []asnPolicy{{CommandCode: int(tpm2.TPMCCPolicyPCR), CommandPolicy: append(sel, k.PCRDigest...)}, cc}, nil
	}
	var out []asnPolicy
	for _, a := range k.Authorities {
		b := tpm2.Marshal(tpm2.New2B(a.public))
		b = append(b, tpm2.Marshal(tpm2.TPM2BDigest{Buffer: []byte(k.Binding.Ref())})...)
		b = append(b, tpm2.Marshal(tpm2.TPMTSignature{SigAlg: tpm2.TPMAlgNull})...)
		out = append(out, asnPolicy{CommandCode: int(tpm2.TPMCCPolicyAuthorize), CommandPolicy: b})
	}
	out = append(out, cc)
	if len(k.Authorities) > 1 {
		_, branches, err := AuthorizedPolicy(k.Authorities, k.Binding.Ref())
		if err != nil {
			return nil, err
		}
		out = append(out, asnPolicy{CommandCode: int(tpm2.TPMCCPolicyOR), CommandPolicy: tpm2.Marshal(DigestList(branches))})
	}
	return out, nil
}

func (k *KeyBlob) MarshalPEM(description string) ([]byte, error) {
	policy, err := k.policyStatements()
	if err != nil {
		return nil, err
	}
	der, err := asn1.Marshal(asnKey{
		Type:        oidLoadableKey,
		EmptyAuth:   true,
		Policy:      policy,
		Description: description,
		Parent:      int64(tpm2.TPMRHOwner),
		PubKey:      tpm2.Marshal(k.Public),
		PrivKey:     tpm2.Marshal(k.Private),
	})
	if err != nil {
		return nil, fmt.Errorf("encode key blob: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemType, Bytes: der}), nil
}

// ParseKeyBlob decodes a key blob file and checks that its policy is the
// one this backend writes.
func ParseKeyBlob(data []byte) (*KeyBlob, error) {
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
	blob := &KeyBlob{}
	pub, err := tpm2.Unmarshal[tpm2.TPM2BPublic](k.PubKey)
	if err != nil {
		return nil, fmt.Errorf("decode key blob public area: %w", err)
	}
	blob.Public = *pub
	priv, err := tpm2.Unmarshal[tpm2.TPM2BPrivate](k.PrivKey)
	if err != nil {
		return nil, fmt.Errorf("decode key blob private area: %w", err)
	}
	blob.Private = *priv
	if len(k.Policy) > 0 && k.Policy[0].CommandCode == int(tpm2.TPMCCPolicyAuthorize) {
		blob.Authorities, blob.Binding, err = parseAuthorizedPolicy(k.Policy)
		blob.PCRs = blob.Binding.pcrs
		return blob, err
	}
	if len(k.Policy) != 2 ||
		k.Policy[0].CommandCode != int(tpm2.TPMCCPolicyPCR) ||
		!isSignCC(k.Policy[1]) {
		return nil, errors.New("key blob policy is not PolicyPCR + PolicyCommandCode(TPM2_Sign), nor signed policies")
	}
	blob.PCRs, blob.PCRDigest, err = parsePCRPolicy(k.Policy[0].CommandPolicy)
	if err != nil {
		return nil, err
	}
	return blob, nil
}

func isSignCC(p asnPolicy) bool {
	cc := p.CommandPolicy
	return p.CommandCode == int(tpm2.TPMCCPolicyCommandCode) && len(cc) == 4 && tpm2.TPMCC(binary.BigEndian.Uint32(cc)) == tpm2.TPMCCSign
}

// parseAuthorizedPolicy reads the authorities of a signed-policy list:
// PolicyAuthorize statements, PolicyCommandCode(Sign), and PolicyOR when
// there are two or more (see the file format above), and the binding
// their common policyRef names. The caller checks that the list
// reproduces the key's authPolicy.
func parseAuthorizedPolicy(ps []asnPolicy) ([]*Authority, Binding, error) {
	n := slices.IndexFunc(ps, func(p asnPolicy) bool { return p.CommandCode != int(tpm2.TPMCCPolicyAuthorize) })
	want := n + 1
	if n > 1 {
		want++
	}
	if n < 1 || n > MaxAuthorities || len(ps) != want || !isSignCC(ps[n]) {
		return nil, Binding{}, errors.New("key blob signed policy is not PolicyAuthorize... + PolicyCommandCode(TPM2_Sign) [+ PolicyOR]")
	}
	if n > 1 && ps[n+1].CommandCode != int(tpm2.TPMCCPolicyOR) {
		return nil, Binding{}, errors.New("key blob with several policy authorities has no PolicyOR")
	}
	auths := make([]*Authority, n)
	var refs []string
	for i := range n {
		a, ref, err := parsePolicyAuthorize(ps[i].CommandPolicy)
		if err != nil {
			return nil, Binding{}, fmt.Errorf("key blob PolicyAuthorize %d: %w", i, err)
		}
		auths[i], refs = a, append(refs, ref)
	}
	if len(slices.Compact(refs)) != 1 {
		return nil, Binding{}, errors.New("key blob PolicyAuthorize statements name different policyRefs")
	}
	b, err := bindingOfRef(refs[0])
	if err != nil {
		return nil, Binding{}, fmt.Errorf("key blob: %w", err)
	}
	return auths, b, nil
}

// parsePolicyAuthorize decodes TPM2B_PUBLIC keySign || TPM2B_DIGEST
// policyRef || TPMT_SIGNATURE (empty).
func parsePolicyAuthorize(b []byte) (*Authority, string, error) {
	pubBytes, rest, err := cut2B(b)
	if err != nil {
		return nil, "", err
	}
	ref, rest, err := cut2B(rest)
	if err != nil {
		return nil, "", err
	}
	if !bytes.Equal(rest, tpm2.Marshal(tpm2.TPMTSignature{SigAlg: tpm2.TPMAlgNull})) {
		return nil, "", errors.New("the policy signature must be empty")
	}
	pub, err := tpm2.Unmarshal[tpm2.TPMTPublic](pubBytes)
	if err != nil {
		return nil, "", fmt.Errorf("keySign: %w", err)
	}
	a, err := authorityFromPublic(*pub)
	return a, string(ref), err
}

// cut2B splits a TPM2B (2-byte big-endian size, then the bytes) off b.
func cut2B(b []byte) (body, rest []byte, err error) {
	if len(b) < 2 {
		return nil, nil, errors.New("truncated")
	}
	n := int(binary.BigEndian.Uint16(b))
	if len(b) < 2+n {
		return nil, nil, errors.New("truncated")
	}
	return b[2 : 2+n], b[2+n:], nil
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
		if why := ResettablePCR(p); why != "" {
			return nil, nil, fmt.Errorf("key blob is bound to PCR %d, and PCR %d %s: the key signs in any boot state; create a new key bound to PCRs 0-15 (steward-trustd-ceremony rotate --new-signer URI --pcrs 7)", p, p, why)
		}
	}
	return pcrs, append([]byte(nil), digest...), nil
}

// PCRSelection is the sha256 selection of pcrs.
func PCRSelection(pcrs []int) tpm2.TPMLPCRSelection {
	idx := make([]uint, len(pcrs))
	for i, p := range pcrs {
		idx[i] = uint(p)
	}
	return tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{{
		Hash:      tpm2.TPMAlgSHA256,
		PCRSelect: tpm2.PCClientCompatible.PCRs(idx...),
	}}}
}
