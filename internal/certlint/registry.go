package certlint

import (
	"fmt"
	"sync"

	"github.com/zmap/zlint/v3/lint"
)

// includedSources are the zlint lint sources that apply to a private PKI:
// the IETF profiles every X.509 verifier implements, and zlint's
// community lints (encoding and name hygiene, weak keys).
var includedSources = lint.SourceList{
	lint.RFC3279, // algorithm identifiers and key encodings
	lint.RFC5280, // the Internet X.509 profile itself
	lint.RFC5480, // ECC SubjectPublicKeyInfo
	lint.RFC5891, // IDNA in DNS names
	lint.RFC8813, // ECC key usage
	lint.Community,
}

// excludedSources are left out because they govern the Web PKI or other
// certificate kinds, not a cluster's private CA. Listed so that a reader
// sees the decision, and TestRegistrySources that nothing is forgotten.
var excludedSources = map[lint.LintSource]string{
	lint.CABFBaselineRequirements:      "CA/Browser Forum Baseline Requirements: publicly trusted TLS only (they demand e.g. CRL/OCSP pointers, policy OIDs, public-suffix names that a cluster CA has no use for)",
	lint.CABFEVGuidelines:              "Extended Validation: publicly trusted TLS only",
	lint.CABFSMIMEBaselineRequirements: "S/MIME certificates: not issued here",
	lint.CABFCSBaselineRequirements:    "code-signing certificates: not issued here",
	lint.MozillaRootStorePolicy:        "Mozilla root store membership: Web PKI only",
	lint.AppleRootStorePolicy:          "Apple root store membership: Web PKI only",
	lint.ChromeRootStorePolicy:         "Chrome root store membership: Web PKI only",
	lint.EtsiEsi:                       "ETSI qualified certificates (eIDAS): not issued here",
	lint.RFC6960:                       "OCSP responses: not issued here",
	lint.RFC6962:                       "Certificate Transparency SCTs and precertificates: a private CA does not log to public CT",
}

// excludedLints are lints of the included sources that do not fit Talos's
// profiles, each with the reason. Everything else of those sources runs.
var excludedLints = map[string]string{
	"e_rfc_dnsname_empty_label": "a worker's host name may be an absolute name with a trailing dot (the final empty label), which Talos workers send and the daemon issues as asked; an empty label inside a name is refused earlier by pki.CheckDNSName",
}

// registry is the filtered zlint registry, built once: it never changes
// after the first call.
var registry = sync.OnceValues(func() (lint.Registry, error) {
	r, err := lint.GlobalRegistry().Filter(lint.FilterOptions{
		IncludeSources: includedSources,
		ExcludeNames:   excludedNames(),
	})
	if err != nil {
		// The names above are constants checked by TestRegistryBuilds; a
		// zlint upgrade that renames one fails there first.
		return nil, fmt.Errorf("certlint: zlint registry: %w", err)
	}
	return r, nil
})

func excludedNames() []string {
	out := make([]string, 0, len(excludedLints))
	for n := range excludedLints {
		out = append(out, n)
	}
	return out
}
