package main

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sort"
)

// servingHosts lists every local interface address, the hostname and the
// extra SANs (warnings go to log): workers dial whichever address the control-plane endpoint
// resolves to and check it against the IP SANs.
//
// Listing interfaces needs a netlink socket, which a sandbox may forbid
// (systemd's RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX in
// deploy/systemd). Then the certificate names the hostname and the extra
// SANs only, and one warning says to set TRUSTD_CERT_SANS, instead of
// the daemon exiting and restart-looping.
func servingHosts(extra []string, log *slog.Logger) ([]string, error) {
	return hostSources{interfaceAddrs: net.InterfaceAddrs, hostname: os.Hostname, log: log}.hosts(extra)
}

// hostSources are where servingHosts looks; tests replace them.
type hostSources struct {
	interfaceAddrs func() ([]net.Addr, error)
	hostname       func() (string, error)
	log            *slog.Logger
}

// hosts returns extra, then the hostname, then the sorted interface
// addresses (link-local ones left out: workers cannot dial them without
// a zone), each once.
func (s hostSources) hosts(extra []string) ([]string, error) {
	out := appendUnique(nil, extra...)
	if h, err := s.hostname(); err == nil {
		out = appendUnique(out, h)
	}
	addrs, err := s.interfaceAddrs()
	if err != nil {
		return s.withoutInterfaces(out, err)
	}
	var ips []string
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() {
			ips = append(ips, n.IP.String())
		}
	}
	sort.Strings(ips)
	return appendUnique(out, ips...), nil
}

// withoutInterfaces is the fallback when interfaces cannot be listed: the
// hosts found so far, with one warning, or an error when there are none.
func (s hostSources) withoutInterfaces(hosts []string, cause error) ([]string, error) {
	if len(hosts) == 0 {
		return nil, fmt.Errorf("list interface addresses: %w; and no hostname: set TRUSTD_CERT_SANS (--cert-sans) to the addresses and names workers dial", cause)
	}
	s.log.Warn("cannot list network interfaces; the serving certificate names only the hostname and TRUSTD_CERT_SANS: "+
		"set TRUSTD_CERT_SANS (--cert-sans) to every address and name workers dial (the control-plane endpoint), or workers' TLS fails",
		"error", cause.Error(), "sans", hosts)
	return hosts, nil
}

// appendUnique appends each non-empty h not already in out.
func appendUnique(out []string, hs ...string) []string {
	for _, h := range hs {
		if h != "" && !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

// warnMissingSANs warns, once at start, when a serving certificate of the
// operator's own (server.crt, or TRUSTD_SERVER_CRT) does not name every
// entry of TRUSTD_CERT_SANS: such a certificate wins over the setting, and
// a worker dialling a missing name or address fails its TLS check.
func warnMissingSANs(leaf *x509.Certificate, sans []string, log *slog.Logger) {
	if missing := missingSANs(leaf, sans); len(missing) > 0 {
		log.Warn("the loaded serving certificate (server.crt) does not name these TRUSTD_CERT_SANS entries, and workers dialling them will refuse it: "+
			"re-issue it with those names (steward-trustd-ceremony server-cert --san …), or remove server.crt and server.key so that the daemon issues its own with TRUSTD_CERT_SANS",
			"missing", missing, "dns", leaf.DNSNames, "ips", leaf.IPAddresses)
	}
}

// missingSANs lists the entries of sans leaf is not valid for, checked as
// a worker checks the address it dialled (x509's VerifyHostname).
func missingSANs(leaf *x509.Certificate, sans []string) []string {
	var missing []string
	for _, s := range sans {
		if leaf.VerifyHostname(s) != nil {
			missing = append(missing, s)
		}
	}
	return missing
}
