package attestation_test

import (
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/attestation"
)

func TestParseRefusesMalformedFiles(t *testing.T) {
	cases := []struct {
		name  string
		parse func([]byte) error
		data  string
		want  string
	}{
		{"evidence wrong version", func(b []byte) error { _, err := attestation.ParseEvidence(b); return err }, `{"version":2}`, "version 2"},
		{"evidence unknown field", func(b []byte) error { _, err := attestation.ParseEvidence(b); return err }, `{"version":1,"extra":1}`, "unknown field"},
		{"evidence trailing data", func(b []byte) error { _, err := attestation.ParseEvidence(b); return err }, `{"version":1} {}`, "trailing"},
		{"request without evidence", func(b []byte) error { _, err := attestation.ParseRequest(b); return err }, `{"version":1,"csr":"AA=="}`, "with a CSR"},
		{"sealed without AK name", func(b []byte) error { _, err := attestation.ParseSealed(b); return err }, `{"version":1}`, "AK name"},
		{"CA evidence without evidence", func(b []byte) error { _, err := attestation.ParseCAEvidence(b); return err }, `{"version":1}`, "version 1"},
		{"EK roots empty", func(b []byte) error { _, err := attestation.ParseEKRoots(b); return err }, "", "no self-signed root"},
		{"EK roots not a certificate", func(b []byte) error { _, err := attestation.ParseEKRoots(b); return err }, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "certificate 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.parse([]byte(tc.data)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestCheckResponse(t *testing.T) {
	secret := attestation.EncodeSecret([]byte(strings.Repeat("s", attestation.ChallengeSize)))
	other := attestation.EncodeSecret([]byte(strings.Repeat("o", attestation.ChallengeSize)))
	if err := attestation.CheckResponse(secret, secret); err != nil {
		t.Fatal(err)
	}
	for _, resp := range [][]byte{other, []byte("not hex"), nil} {
		if got := attestation.FailedCheck(attestation.CheckResponse(secret, resp)); got != attestation.CheckCredential {
			t.Errorf("response %q: check %q, want credential", resp, got)
		}
	}
	if err := attestation.CheckResponse([]byte("short"), secret); err == nil || attestation.FailedCheck(err) != "" {
		t.Errorf("a broken secret file is an error, not a refusal: %v", err)
	}
}

func TestVerifyNeedsExpectations(t *testing.T) {
	if _, err := attestation.Verify(&attestation.Evidence{}, attestation.Options{}); err == nil {
		t.Fatal("Verify without qualifying data or public key passed")
	}
}
