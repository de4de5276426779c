package pkcs11

import (
	"strings"
	"testing"
)

// p11toolTPMURI is what p11tool --list-all prints for a tpm2-pkcs11 token
// on swtpm: its model is NUL-padded, and p11tool copies the NULs.
const p11toolTPMURI = "pkcs11:model=SW%20%20%20TPM%00%00%00%00%00%00%00%00;manufacturer=IBM;serial=0000000000000000;token=trustd;id=%01;object=os-ca;type=private"

// TestPaddedURIMatches: URI values and token fields are compared with
// trailing blanks and NULs removed on both sides, and a mismatch names
// every attribute that differs, with both values.
func TestPaddedURIMatches(t *testing.T) {
	u, err := ParseURI(p11toolTPMURI + "?" + mp + "&pin-source=/p")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		token [4]string // label, manufacturer, model, serial as the module pads them
		want  []string
	}{
		{"tpm2-pkcs11 NUL padding", [4]string{"trustd" + strings.Repeat(" ", 26), "IBM" + strings.Repeat(" ", 29), "SW   TPM\x00\x00\x00\x00\x00\x00\x00\x00", "0000000000000000"}, nil},
		{"blank padding", [4]string{"trustd  ", "IBM ", "SW   TPM        ", "0000000000000000"}, nil},
		{"serial and manufacturer differ", [4]string{"trustd", "Other", "SW   TPM", "1234"},
			[]string{`manufacturer: URI says "IBM", found "Other"`, `serial: URI says "0000000000000000", found "1234"`}},
		{"inner blanks count", [4]string{"trustd", "IBM", "SW TPM", "0000000000000000"}, []string{`model: URI says "SW   TPM", found "SW TPM"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mismatches([]attrCheck{
				{"token", u.Token, tt.token[0]},
				{"manufacturer", u.Manufacturer, tt.token[1]},
				{"model", u.Model, tt.token[2]},
				{"serial", u.Serial, tt.token[3]},
			})
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Fatalf("mismatches = %q, want %q", got, tt.want)
			}
		})
	}
}
