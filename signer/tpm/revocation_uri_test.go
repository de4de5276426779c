package tpm

import (
	"errors"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// TestRevocationURI: revocation= parses to an r1 binding over the URI's
// PCRs, renders back, and is refused without approvals=, with
// systemd=true, or outside the owner NV range.
func TestRevocationURI(t *testing.T) {
	u, err := ParseURI("tpm:path=/k.tpmkey;pcrs=7,11;approvals=/a;revocation=0x01000100")
	if err != nil {
		t.Fatal(err)
	}
	b := u.binding()
	if !b.Revocable() || b.RevocationIndex() != 0x01000100 || b.Ref() != "steward-trustd/r1:000880:000100" {
		t.Fatalf("binding %s", b)
	}
	if back, err := ParseURI(u.String()); err != nil || back.Revocation != u.Revocation {
		t.Fatalf("round trip %q: %v", u.String(), err)
	}
	for uri, msg := range map[string]string{
		"tpm:path=/k.tpmkey;revocation=0x01000100":                           "approvals directory",
		"tpm:path=/k.tpmkey;approvals=/a;systemd=true;revocation=0x01000100": "exclude each other",
		"tpm:path=/k.tpmkey;approvals=/a;revocation=0x01c00002":              "owner NV index",
		"tpm:path=/k.tpmkey;approvals=/a;revocation=1000100":                 "8 hex digits",
		"tpm:path=/k.tpmkey;approvals=/a;revocation=0x0100010":               "8 hex digits",
	} {
		if _, err := ParseURI(uri); !errors.Is(err, signer.ErrInvalidURI) || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseURI(%q) = %v, want ErrInvalidURI with %q", uri, err, msg)
		}
	}
	if _, err := WithRevocation("tpm:path=/k.tpmkey;approvals=/a;revocation=0x01000100", tpmpolicy.DefaultRevocationIndex); err == nil {
		t.Error("WithRevocation over a URI that names one already")
	}
}
