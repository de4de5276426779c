package attestation_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/attestation"
)

func TestEKPins(t *testing.T) {
	a, b := strings.Repeat("ab", 32), strings.Repeat("cd", 32)
	pins, err := attestation.ParseEKPins([]byte("# fleet\n\nnode-a " + a + "\nnode-b sha256:" + strings.ToUpper(b[:2]) + ":" + b[2:] + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, node, ek string
		pins           attestation.EKPins
		want           string // "" accepted, else part of the refusal
	}{
		{"pinned EK", "node-a", a, pins, ""},
		{"colon and prefix forms", "node-b", b, pins, ""},
		{"another EK", "node-a", b, pins, "another TPM's EK"},
		{"unlisted node", "node-c", a, pins, `node "node-c" has no pinned EK`},
		{"no pins", "node-c", a, nil, ""},
		{"one pin for every node", "node-c", a, attestation.EKPins{"*": a}, ""},
		{"one pin, another EK", "node-c", b, attestation.EKPins{"*": a}, "another TPM's EK"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.pins.Check(tc.node, tc.ek)
			if tc.want == "" && err != nil || tc.want != "" && (attestation.FailedCheck(err) != attestation.CheckEKPin || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

func TestParseEKPinsRefuses(t *testing.T) {
	for name, data := range map[string]string{
		"empty":          "# nothing\n",
		"three fields":   "node-a " + strings.Repeat("ab", 32) + " extra\n",
		"short digest":   "node-a abcd\n",
		"pinned twice":   "node-a " + strings.Repeat("ab", 32) + "\nnode-a " + strings.Repeat("cd", 32) + "\n",
		"not hex digits": "node-a " + strings.Repeat("zz", 32) + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := attestation.ParseEKPins([]byte(data)); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestParseEKFingerprintOfCertificate(t *testing.T) {
	der := []byte("not really DER, hashed as given")
	sum := sha256.Sum256(der)
	pemFile := "-----BEGIN CERTIFICATE-----\nbm90IHJlYWxseSBERVIsIGhhc2hlZCBhcyBnaXZlbg==\n-----END CERTIFICATE-----\n"
	for name, file := range map[string][]byte{"DER": der, "PEM": []byte(pemFile)} {
		got, err := attestation.ParseEKFingerprint("ek", file)
		if err != nil || got != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: %s, %v", name, got, err)
		}
	}
}

func TestActivationProof(t *testing.T) {
	enr, err := attestation.NewEnrolment(nil, []byte("chain"))
	if err != nil {
		t.Fatal(err)
	}
	commitment := attestation.ActivationCommitment(enr.ActivationSecret)
	if strings.Contains(commitment, hex.EncodeToString(enr.ActivationSecret)) {
		t.Fatal("the commitment carries the secret")
	}
	fp := strings.Repeat("0", 64)
	good := &attestation.ActivationProof{Version: attestation.ActivationProofVersion, Certificate: fp, Secret: enr.ActivationSecret}
	data, err := good.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := attestation.ParseActivationProof(data)
	if err != nil || parsed.Check(commitment) != nil {
		t.Fatalf("the node's own proof: %v %v", err, parsed.Check(commitment))
	}
	forged := &attestation.ActivationProof{Version: attestation.ActivationProofVersion, Certificate: fp, Secret: make([]byte, attestation.ChallengeSize)}
	if err := forged.Check(commitment); attestation.FailedCheck(err) != attestation.CheckActivation {
		t.Fatalf("a made-up secret: %v", err)
	}
	payload, err := enr.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if back, err := attestation.ParseEnrolment(payload); err != nil || string(back.Chain) != "chain" {
		t.Fatalf("enrolment round trip: %v", err)
	}
	for _, bad := range []string{`{"version":1,"chain":"Y2hhaW4=","activationSecret":"AA=="}`, "-----BEGIN CERTIFICATE-----\n", `{"version":1,"certificate":"00","secret":"AA=="}`} {
		if _, err := attestation.ParseEnrolment([]byte(bad)); err == nil {
			t.Errorf("enrolment %q accepted", bad)
		}
		if _, err := attestation.ParseActivationProof([]byte(bad)); err == nil {
			t.Errorf("proof %q accepted", bad)
		}
	}
}
