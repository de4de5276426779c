package pki

import (
	"fmt"
	"net"
	"strings"
)

// NameRule selects which DNS names CheckDNSName accepts. There are two
// on purpose: we are strict about names we choose ourselves, and accept
// the host names real workers have.
type NameRule int

const (
	// OwnName is the rule for names we put into certificates we ask for
	// (trustd's serving certificate, talosconfig endpoints): RFC 1123
	// host names, labels of letters, digits and '-' (1-63 characters, no
	// '-' at either end), at most 253 characters, no trailing dot.
	OwnName NameRule = iota
	// WorkerName is the rule for the DNS SANs a worker's CSR asks for:
	// OwnName plus '_' in a label (cloud and Kubernetes node names carry
	// it, and Go's TLS verification accepts it) and one trailing dot (a
	// fully qualified name). The name is issued as asked.
	WorkerName
)

// CheckDNSName checks name against rule. Both rules refuse wildcards:
// trustd issues no wildcard serving certificates.
func CheckDNSName(name string, rule NameRule) error {
	s := name
	if rule == WorkerName {
		s = strings.TrimSuffix(s, ".")
	}
	if s == "" || len(s) > 253 {
		return fmt.Errorf("%q is not a valid DNS name (1-253 characters)", name)
	}
	for _, label := range strings.Split(s, ".") {
		if err := checkLabel(label, rule); err != nil {
			return fmt.Errorf("%q is not a valid DNS name: %w", name, err)
		}
	}
	return nil
}

func checkLabel(label string, rule NameRule) error {
	switch {
	case label == "*":
		return fmt.Errorf("wildcards are not issued")
	case len(label) == 0 || len(label) > 63:
		return fmt.Errorf("label %q must have 1-63 characters", label)
	case label[0] == '-' || label[len(label)-1] == '-':
		return fmt.Errorf("label %q starts or ends with '-'", label)
	}
	for _, c := range label {
		if !hostChar(c) && (rule != WorkerName || c != '_') {
			return fmt.Errorf("label %q holds %q", label, c)
		}
	}
	return nil
}

func hostChar(c rune) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-'
}

// SplitHosts splits host names we put into our own certificates into IP
// addresses and DNS names (OwnName, lower-cased); blank entries are
// skipped.
func SplitHosts(hosts []string) ([]net.IP, []string, error) {
	var ips []net.IP
	var dns []string
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
			continue
		}
		if err := CheckDNSName(h, OwnName); err != nil {
			return nil, nil, fmt.Errorf("%q is neither an IP address nor a DNS name: %w", h, err)
		}
		dns = append(dns, strings.ToLower(h))
	}
	return ips, dns, nil
}
