package attestation

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"strings"

	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// EKPins maps node names (the request's common name) to the SHA-256
// fingerprint of the only EK certificate accepted for that node. The
// name "*" pins every node to one EK (--ek-pin). EK roots say "a genuine
// TPM"; a pin says "this node's TPM", so evidence built around another
// genuine TPM's EK certificate is refused.
type EKPins map[string]string

// ParseEKFingerprint reads an EK pin: an EK certificate (PEM or DER) or
// its hex SHA-256 fingerprint (colons and a "sha256:" prefix allowed).
func ParseEKFingerprint(s string, file []byte) (string, error) {
	if file != nil {
		der := file
		if b, _ := pem.Decode(file); b != nil {
			der = b.Bytes
		}
		sum := sha256.Sum256(der)
		return hex.EncodeToString(sum[:]), nil
	}
	h, err := pki.ParseFingerprint(strings.TrimPrefix(strings.TrimSpace(s), "sha256:"))
	if err != nil {
		return "", fmt.Errorf("%q is neither an EK certificate file nor a hex SHA-256 fingerprint (64 hex digits, as verify-attestation and the enrolment receipt print it)", s)
	}
	return h, nil
}

// ParseEKPins reads a pin file: one "NODE-NAME FINGERPRINT" per line;
// blank lines and lines starting with # are ignored.
func ParseEKPins(data []byte) (EKPins, error) {
	pins := EKPins{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("line %d: want NODE-NAME EK-FINGERPRINT", n)
		}
		fp, err := ParseEKFingerprint(f[1], nil)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if _, dup := pins[f[0]]; dup {
			return nil, fmt.Errorf("line %d: node %s is pinned twice", n, f[0])
		}
		pins[f[0]] = fp
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(pins) == 0 {
		return nil, fmt.Errorf("no pins (want lines NODE-NAME EK-FINGERPRINT)")
	}
	return pins, nil
}

// Check refuses an EK other than the one pinned for node. Without pins
// (nil) every EK the roots accept passes; with pins a node that has none
// is refused.
func (p EKPins) Check(node, ekFingerprint string) error {
	if p == nil {
		return nil
	}
	want, ok := p[node]
	if !ok {
		want, ok = p["*"]
	}
	if !ok {
		return refuse(CheckEKPin, "node %q has no pinned EK; add the line \"%s %s\" to the pin file once you have checked that fingerprint on the node itself", node, node, ekFingerprint)
	}
	if want != ekFingerprint {
		return refuse(CheckEKPin, "the evidence names EK certificate %s, but node %q is pinned to %s: another TPM's EK", ekFingerprint, node, want)
	}
	return nil
}
