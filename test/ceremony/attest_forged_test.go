package ceremony_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/internal/attestation"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// TestAttestedEnrolmentForgedEvidence: evidence alone is not attestation.
// A software
// AK and key around a genuine EK certificate borrowed from another TPM
// (swtpm's, under the trusted EK roots) pass every check evidence can
// carry, so intermediate sign must record them as "pending activation",
// never "attested"; confirm refuses a proof the forger makes up (it
// cannot run TPM2_ActivateCredential with that EK); an EK pin refuses
// evidence naming any EK but the node's.
func TestAttestedEnrolmentForgedEvidence(t *testing.T) {
	requireScheme(t, "tpm")
	tr := newTierRun(t)
	n := newEnrolNode(t, tr)
	forged := forgeRequest(t, n)
	sealed := filepath.Join(n.dir, "forged.sealed.json")
	if r := n.sign(t, tr, forged, sealed, "--ek-roots", n.ekRoots); r.code != 0 || !strings.Contains(r.stdout, "pending activation") {
		t.Fatalf("forged evidence (checks pass, activation cannot): %s", r)
	}
	enrol := lastReceipt(t, n.root, "intermediate.enrol")
	if a := enrol.Details["attestation"]; !strings.HasPrefix(a, "pending activation") || strings.HasPrefix(a, "attested") {
		t.Fatalf("receipt of forged evidence says %q", a)
	}
	proof, err := (&attestation.ActivationProof{Version: attestation.ActivationProofVersion, Certificate: enrol.CertificateFingerprint, Secret: make([]byte, attestation.ChallengeSize)}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	proofPath := filepath.Join(n.dir, "made-up.activation.json")
	writeFile(t, proofPath, proof)
	if r := ceremony(t, nil, "intermediate", "confirm", "--proof", proofPath, "--dir", n.root); r.code != 1 || !strings.Contains(r.stderr, "check activation") {
		t.Fatalf("confirm with a made-up proof: %s", r)
	}
	if c := lastReceipt(t, n.root, "intermediate.confirm"); c.Details["outcome"] != "refused" {
		t.Fatalf("refused confirm recorded as %q", c.Details["outcome"])
	}
	t.Run("pinned to another EK", func(t *testing.T) {
		other := sha256.Sum256(pemBlock(t, n.ekRoots))
		pins := filepath.Join(n.dir, "ek-pins")
		writeFile(t, pins, []byte("# node EK\nnode-a "+hex.EncodeToString(other[:])+"\n"))
		for _, req := range []string{forged, n.req} {
			r := n.sign(t, tr, req, filepath.Join(n.dir, "pinned.sealed.json"), "--ek-roots", n.ekRoots, "--ek-pins", pins)
			if r.code != 1 || !strings.Contains(r.stderr, "check ek-pin") || !strings.Contains(r.stderr, "another TPM's EK") {
				t.Fatalf("evidence from an EK other than the pinned one: %s", r)
			}
		}
		writeFile(t, pins, []byte("node-b "+hex.EncodeToString(other[:])+"\n"))
		if r := n.sign(t, tr, n.req, filepath.Join(n.dir, "pinned.sealed.json"), "--ek-roots", n.ekRoots, "--ek-pins", pins); r.code != 1 || !strings.Contains(r.stderr, `node "node-a" has no pinned EK`) {
			t.Fatalf("a node without a pin: %s", r)
		}
	})
}

// lastReceipt is the newest receipt of operation op in dir.
func lastReceipt(t *testing.T, dir, op string) keystore.Receipt {
	t.Helper()
	rs, err := keystore.ReadReceipts(keystore.OSDir{Root: dir})
	if err != nil {
		t.Fatal(err)
	}
	var last keystore.Receipt
	for _, r := range rs {
		if string(r.Operation) == op {
			last = r
		}
	}
	if last.Operation == "" {
		t.Fatalf("no %s receipt in %s", op, dir)
	}
	return last
}

// pemBlock is the DER of the first PEM block of path.
func pemBlock(t *testing.T, path string) []byte {
	t.Helper()
	b, _ := pem.Decode(readFile(t, path))
	if b == nil {
		t.Fatalf("%s: no PEM", path)
	}
	return b.Bytes
}

// forgeRequest writes an attested request made in software: a CSR for a
// software key, and evidence with the node's genuine EK certificate and
// EK public area but a software AK that "certifies" the software key's
// creation with a PCR 7 policy.
func forgeRequest(t *testing.T, n *enrolNode) string {
	t.Helper()
	real, err := attestation.ParseRequest(readFile(t, n.req))
	if err != nil {
		t.Fatal(err)
	}
	ak, key := newP256(t), newP256(t)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node-a"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	ev := &attestation.Evidence{
		Version: attestation.EvidenceVersion, EKCertificate: real.Evidence.EKCertificate, EKChain: real.Evidence.EKChain, EKPublic: real.Evidence.EKPublic,
		AKPublic: tpm2.Marshal(eccPublic(t, &ak.PublicKey, tpm2.TPMAObject{FixedTPM: true, FixedParent: true, SensitiveDataOrigin: true, UserWithAuth: true, Restricted: true, SignEncrypt: true}, nil)),
	}
	sel := tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{{Hash: tpm2.TPMAlgSHA256, PCRSelect: []byte{0x80, 0, 0}}}}
	pcrDigest := sha256.Sum256([]byte("any PCR 7 value the forger likes"))
	policy, err := attestation.PCRPolicy(sel, pcrDigest[:])
	if err != nil {
		t.Fatal(err)
	}
	ev.KeyPublic = tpm2.Marshal(eccPublic(t, &key.PublicKey, tpm2.TPMAObject{FixedTPM: true, FixedParent: true, SensitiveDataOrigin: true, AdminWithPolicy: true, SignEncrypt: true}, policy))
	ev.CreationData = tpm2.Marshal(tpm2.TPMSCreationData{PCRSelect: sel, PCRDigest: tpm2.TPM2BDigest{Buffer: pcrDigest[:]}, ParentNameAlg: tpm2.TPMAlgSHA256, OutsideInfo: tpm2.TPM2BData{Buffer: []byte("steward-trustd OS CA")}})
	ev.Attest, ev.Signature = certifyCreation(t, ak, ev, attestation.CSRQualifyingData(csr))
	data, err := json.Marshal(attestation.Request{Version: attestation.RequestVersion, CSR: csr, Evidence: ev})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(n.dir, "forged.attested.json")
	writeFile(t, path, data)
	return path
}

// certifyCreation is a software TPM2_CertifyCreation: the TPMS_ATTEST a
// TPM would produce, signed by the software AK.
func certifyCreation(t *testing.T, ak *ecdsa.PrivateKey, ev *attestation.Evidence, qualifyingData []byte) ([]byte, []byte) {
	t.Helper()
	keyName, creationHash := sha256.Sum256(ev.KeyPublic), sha256.Sum256(ev.CreationData)
	attest := tpm2.Marshal(tpm2.TPMSAttest{
		Magic: tpm2.TPMGeneratedValue, Type: tpm2.TPMSTAttestCreation, ExtraData: tpm2.TPM2BData{Buffer: qualifyingData},
		Attested: tpm2.NewTPMUAttest(tpm2.TPMSTAttestCreation, &tpm2.TPMSCreationInfo{
			ObjectName:   tpm2.TPM2BName{Buffer: append([]byte{0, byte(tpm2.TPMAlgSHA256)}, keyName[:]...)},
			CreationHash: tpm2.TPM2BDigest{Buffer: creationHash[:]},
		}),
	})
	digest := sha256.Sum256(attest)
	r, s, err := ecdsa.Sign(rand.Reader, ak, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := tpm2.Marshal(tpm2.TPMTSignature{SigAlg: tpm2.TPMAlgECDSA, Signature: tpm2.NewTPMUSignature(tpm2.TPMAlgECDSA, &tpm2.TPMSSignatureECC{
		Hash: tpm2.TPMAlgSHA256, SignatureR: tpm2.TPM2BECCParameter{Buffer: r.Bytes()}, SignatureS: tpm2.TPM2BECCParameter{Buffer: s.Bytes()},
	})})
	return attest, sig
}

// eccPublic is tpmsim.ECCPublic that must succeed.
func eccPublic(t *testing.T, pub *ecdsa.PublicKey, attrs tpm2.TPMAObject, authPolicy []byte) tpm2.TPMTPublic {
	t.Helper()
	p, err := tpmsim.ECCPublic(pub, attrs, authPolicy)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newP256(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
