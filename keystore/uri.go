package keystore

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/steward-trustd/steward-trustd/signer"
)

// ParsePCRList parses "7,11" into a sorted, duplicate-free PCR list
// (0..23, the PCRs of a PC Client TPM).
func ParsePCRList(s string) ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 || n > 23 {
			return nil, fmt.Errorf("PCR %q: want a number from 0 to 23", f)
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	sort.Ints(out)
	return out, nil
}

// WithPCRs adds the PCR selection to a tpm: key URI as its pcrs=
// attribute (the signer/tpm URI grammar: attributes separated by ';').
// A selection on a non-TPM URI, or one that conflicts with a pcrs= the
// URI already has, is refused; nil pcrs returns uri unchanged.
func WithPCRs(uri string, pcrs []int) (string, error) {
	if len(pcrs) == 0 {
		return uri, nil
	}
	rest, ok := strings.CutPrefix(uri, "tpm:")
	if !ok {
		return "", fmt.Errorf("%w: --pcrs only applies to tpm: key URIs", signer.ErrInvalidURI)
	}
	s := make([]string, len(pcrs))
	for i, p := range pcrs {
		s[i] = strconv.Itoa(p)
	}
	want := strings.Join(s, ",")
	for _, attr := range strings.Split(rest, ";") {
		if v, ok := strings.CutPrefix(attr, "pcrs="); ok {
			have, err := ParsePCRList(v)
			if err != nil {
				return "", fmt.Errorf("%w: %w", signer.ErrInvalidURI, err)
			}
			if fmt.Sprint(have) != fmt.Sprint(pcrs) {
				return "", fmt.Errorf("%w: the key URI already selects PCRs %s, --pcrs says %s", signer.ErrInvalidURI, v, want)
			}
			return uri, nil
		}
	}
	return uri + ";pcrs=" + want, nil
}
