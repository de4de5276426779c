package tpmpolicy

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/signer"
)

// MaxPCR is the highest PCR index a selection may name (a PC Client TPM
// has 24 PCRs).
const MaxPCR = 23

// ParsePCRs parses a comma-separated list of sha256 PCR indices (0-23), no
// duplicates, and returns it sorted. It is the one rule for every PCR
// selection: keys, approvals, quotes and attestation. It refuses the PCRs
// software can reset (ResettablePCR): a policy over them proves nothing.
func ParsePCRs(v string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 || n > MaxPCR || strconv.Itoa(n) != f {
			return nil, invalid("pcrs: %q is not a PCR index 0-%d", f, MaxPCR)
		}
		if why := ResettablePCR(n); why != "" {
			return nil, invalid("pcrs: PCR %d %s, so a policy over it proves nothing about how the machine booted; "+
				"bind to PCRs that only a reboot resets (0-15, e.g. 7, the Secure Boot state, the default)", n, why)
		}
		if slices.Contains(out, n) {
			return nil, invalid("pcrs: PCR %d given twice", n)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// ResettablePCR says why software can reset PCR n with TPM2_PCR_Reset
// (TPM 2.0 Part 3 §22.3) on a PC Client platform, or "" if only a reboot
// (or the hardware's own DRTM event) resets it. The TCG PC Client Platform
// TPM Profile's PCR attributes (as in the reference implementation's
// PCR.c): PCR 16 (debug) and 23 (application) reset from localities 0-3,
// i.e. by any process that can open the TPM; PCRs 20-22 from locality 2,
// the dynamically launched OS (after an Intel TXT / AMD SKINIT launch the
// kernel, so root, holds it). PCRs 17-19 reset only from locality 4, which
// only the DRTM hardware event reaches, and that event measures what it
// launches: they stay allowed.
func ResettablePCR(n int) string {
	switch {
	case n == 16:
		return "is the debug PCR, which any process with TPM access can reset (TPM2_PCR_Reset from locality 0)"
	case n == 23:
		return "is the application PCR, which any process with TPM access can reset (TPM2_PCR_Reset from locality 0)"
	case n >= 20 && n <= 22:
		return "can be reset by the dynamically launched OS (TPM2_PCR_Reset from locality 2)"
	}
	return ""
}

func PCRList(pcrs []int) string {
	s := make([]string, len(pcrs))
	for i, p := range pcrs {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

// PCRDigest is the PolicyPCR pcrDigest: SHA-256 over the selected PCR
// values concatenated in index order (TPM 2.0 Part 3 §23.7).
func PCRDigest(values [][]byte) []byte {
	h := sha256.New()
	for _, v := range values {
		h.Write(v)
	}
	return h.Sum(nil)
}

// PCRAuthPolicy is the key's authPolicy: PolicyPCR(pcrs, pcrDigest)
// then PolicyCommandCode(TPM_CC_Sign), computed in software (Part 3 §23.7,
// §23.11).
func PCRAuthPolicy(pcrs []int, pcrDigest []byte) ([]byte, error) {
	pc, err := tpm2.NewPolicyCalculator(tpm2.TPMAlgSHA256)
	if err != nil {
		return nil, err
	}
	if err := (tpm2.PolicyPCR{PcrDigest: tpm2.TPM2BDigest{Buffer: pcrDigest}, Pcrs: PCRSelection(pcrs)}).Update(pc); err != nil {
		return nil, fmt.Errorf("compute policy: %w", err)
	}
	if err := (tpm2.PolicyCommandCode{Code: tpm2.TPMCCSign}).Update(pc); err != nil {
		return nil, fmt.Errorf("compute policy: %w", err)
	}
	return pc.Hash().Digest, nil
}

// invalid is an error of the PCR selection rule: it wraps
// signer.ErrInvalidURI because the rule is the key URI's pcrs= grammar.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: tpm: "+format, append([]any{signer.ErrInvalidURI}, args...)...)
}
