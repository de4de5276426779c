package pkcs11

import (
	"fmt"
	"strings"
)

// trimField removes the blank padding of a CK_UTF8CHAR field (PKCS#11
// v2.40 §3.2: padded with blanks, not NUL-terminated) and the NULs some
// modules pad with instead (tpm2-pkcs11's model). p11tool --list-all
// copies NULs into the URI as %00, so URI values are trimmed the same
// way before comparing.
func trimField(s string) string { return strings.TrimRight(s, " \x00") }

// field compares a URI attribute with a padded CK_UTF8CHAR field.
func field(want, got string) bool {
	return want == "" || trimField(want) == trimField(got)
}

// attrCheck is one URI attribute and the token's value for it.
type attrCheck struct{ name, want, got string }

// mismatches names every check whose URI value does not match, with both
// values.
func mismatches(checks []attrCheck) []string {
	var out []string
	for _, c := range checks {
		if !field(c.want, c.got) {
			out = append(out, fmt.Sprintf("%s: URI says %q, found %q", c.name, trimField(c.want), trimField(c.got)))
		}
	}
	return out
}
