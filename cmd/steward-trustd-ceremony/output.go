package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/keystore"
)

// checkOutput checks an --output format.
func checkOutput(format string) error {
	if format != "text" && format != "json" {
		return cli.Usagef("--output must be text or json")
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printOutcome(w io.Writer, o *keystore.Outcome) {
	for _, r := range o.Resumed {
		fmt.Fprintf(w, "resumed: %s\n", r)
	}
	for _, p := range o.Written {
		fmt.Fprintf(w, "wrote %s\n", p)
	}
	if o.Receipt.KeyFingerprint != "" {
		fmt.Fprintf(w, "key: %s %s fingerprint %s%s\n", o.Receipt.Backend, o.Receipt.KeyAlgorithm, o.Receipt.KeyFingerprint, parenthesized(o.Receipt.KeyLocation))
	}
	if o.Receipt.CertificateFingerprint != "" {
		fmt.Fprintf(w, "certificate: %s sha256 %s, expires %s\n", o.Receipt.CertificateSubject, o.Receipt.CertificateFingerprint, o.Receipt.CertificateNotAfter.Format(time.RFC3339))
	}
	for _, n := range o.Notes {
		fmt.Fprintf(w, "%s\n", n)
	}
}

// parenthesized is " (s)", or "" for an empty s.
func parenthesized(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

func printStatus(w io.Writer, st *keystore.Status) {
	printKey(w, st)
	printSignedPolicy(w, st.SignedPolicy)
	if ca := st.CA; ca != nil {
		printCert(w, "CA ", ca)
	}
	for i := range st.Chain {
		fmt.Fprintf(w, "issuer chain[%d]:\n", i)
		printCert(w, "  ", &st.Chain[i])
	}
	if st.CA != nil || len(st.Chain) > 0 {
		fmt.Fprintf(w, "key matches:  %t\n", st.KeyMatches())
	}
	if st.ChainError != "" {
		fmt.Fprintf(w, "chain:        REFUSED: %s\n", st.ChainError)
	} else if len(st.Chain) > 0 {
		fmt.Fprintf(w, "chain:        ok (the daemon accepts it)\n")
	}
	printReceipts(w, st)
}

// printCert prints one certificate of status, each line's label after
// prefix ("CA ", or an indent under an issuer chain heading).
func printCert(w io.Writer, prefix string, c *keystore.CAStatus) {
	fmt.Fprintf(w, "%-13s %s\n", prefix+"subject:", c.Subject)
	fmt.Fprintf(w, "%-13s %s\n", prefix+"sha256:", c.Fingerprint)
	fmt.Fprintf(w, "%-13s %s to %s", prefix+"valid:", c.NotBefore.Format(time.RFC3339), c.NotAfter.Format(time.RFC3339))
	if c.Expired {
		fmt.Fprintf(w, " (NOT VALID NOW)")
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-13s %s\n", prefix+"EKU:", c.EKU)
}

func printKey(w io.Writer, st *keystore.Status) {
	k := st.Key
	fmt.Fprintf(w, "backend:      %s\n", k.Backend)
	fmt.Fprintf(w, "location:     %s\n", k.Location)
	fmt.Fprintf(w, "algorithm:    %s\n", k.Algorithm)
	fmt.Fprintf(w, "fingerprint:  %s\n", k.Fingerprint)
	fmt.Fprintf(w, "extractable:  %t\n", k.Extractable)
	if k.Policy != "" {
		fmt.Fprintf(w, "policy:       %s\n", k.Policy)
	}
	if k.PolicyDigest != "" {
		fmt.Fprintf(w, "policyDigest: %s\n", k.PolicyDigest)
	}
	switch {
	case !st.PolicyChecked:
	case st.PolicySatisfied:
		fmt.Fprintf(w, "policy check: satisfied by the current PCR values\n")
	default:
		fmt.Fprintf(w, "policy check: NOT satisfied: %s\n", st.PolicyError)
	}
	if st.Attestable {
		fmt.Fprintf(w, "attestable:   yes: %s\n", st.Attestation)
	} else {
		fmt.Fprintf(w, "attestable:   no: %s\n", st.Attestation)
	}
}

func printReceipts(w io.Writer, st *keystore.Status) {
	if st.ReceiptsError != "" {
		fmt.Fprintf(w, "receipts:     unreadable: %s\n", st.ReceiptsError)
	}
	fmt.Fprintf(w, "receipts:     %d\n", len(st.Receipts))
	for _, r := range st.Receipts {
		fmt.Fprintf(w, "  %s  %-13s key %.16s", r.Time.Format(time.RFC3339), r.Operation, r.KeyFingerprint)
		if r.CertificateFingerprint != "" {
			fmt.Fprintf(w, "  cert %.16s %s", r.CertificateFingerprint, r.CertificateSubject)
		}
		fmt.Fprintln(w)
	}
}
