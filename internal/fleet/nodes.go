// Package fleet checks what Talos workers' apid accepts as client CAs,
// from outside and without credentials: the names a TLS server lists in
// its CertificateRequest (RFC 8446 §4.2.4 certificate_authorities, RFC
// 5246 §7.4.4) are its client-CA pool, which a worker builds from the
// `ca` its trustd returned. A worker whose list names a CA the root did
// not vouch for was answered by a trustd that did not hold to the root's
// statement (a compromised node, or a forged trustd).
package fleet

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// DefaultPort is apid's port.
const DefaultPort = 50000

// ErrTooMany is returned for a node list over the cap.
var ErrTooMany = errors.New("too many nodes")

// ParseNodes reads the --nodes value: a CIDR (every address in it) or the
// content of a file (one host, IP or name, optionally host:port, per line;
// blank lines and # comments skipped). port is used where none is given;
// more than limit nodes is ErrTooMany, so a typo in a prefix length cannot
// start a scan of a /8.
func ParseNodes(spec string, file []byte, port, limit int) ([]string, error) {
	if p, err := netip.ParsePrefix(spec); err == nil {
		return expandPrefix(p.Masked(), port, limit)
	}
	if file == nil {
		return nil, fmt.Errorf("--nodes %q is neither a CIDR nor a readable file", spec)
	}
	return parseNodeFile(file, port, limit)
}

func expandPrefix(p netip.Prefix, port, limit int) ([]string, error) {
	if bits := p.Addr().BitLen() - p.Bits(); bits >= 31 || 1<<bits > limit {
		return nil, fmt.Errorf("%w: %s holds 2^%d addresses, more than the limit of %d (--max-nodes)", ErrTooMany, p, bits, limit)
	}
	var out []string
	for a := p.Addr(); p.Contains(a); a = a.Next() {
		out = append(out, net.JoinHostPort(a.String(), strconv.Itoa(port)))
	}
	return out, nil
}

func parseNodeFile(file []byte, port, limit int) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(file))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		addr, err := withPort(line, port)
		if err != nil {
			return nil, fmt.Errorf("nodes file line %d: %w", n, err)
		}
		if out = append(out, addr); len(out) > limit {
			return nil, fmt.Errorf("%w: more than %d nodes in the file (--max-nodes)", ErrTooMany, limit)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("nodes file: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("nodes file names no node")
	}
	return out, nil
}

// withPort returns host:port for a line holding host, host:port, an IPv6
// address or [v6]:port.
func withPort(s string, port int) (string, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return net.JoinHostPort(a.String(), strconv.Itoa(port)), nil
	}
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		if strings.ContainsAny(s, " \t/[]") {
			return "", fmt.Errorf("%q is not a host or host:port", s)
		}
		return net.JoinHostPort(s, strconv.Itoa(port)), nil
	}
	if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("%q: bad port", s)
	}
	return net.JoinHostPort(host, p), nil
}
