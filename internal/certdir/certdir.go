// Package certdir is the contract of the daemon's certificate directory
// (TRUSTD_CERT_DIR), which is also the ceremony's output directory and
// the content of the Kubernetes Secret: its file names, the worker
// token, the trust bundle the daemon returns to workers, and the Secret
// manifest. The daemon and the ceremony both use it, so they cannot
// disagree about a name or about what the bundle holds.
//
// It links no YAML: the Secret is written as JSON, which kubectl reads
// as YAML.
package certdir

import (
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// File names of the certificate directory and of the ceremony's other
// outputs next to them.
const (
	// FileCACert is the issuing OS CA certificate.
	FileCACert = "os-ca.crt"
	// FileIssuerChain is the signing key's certificate chain in the
	// tiered setup: its own (intermediate) certificate first, then any
	// further intermediates, the root (os-ca.crt) excluded. Absent in the
	// single-tier setup, where os-ca.crt is the signing key's.
	FileIssuerChain = "issuer.crt"
	// FileNextIssuerCSR is the request for a node's new intermediate key
	// during an intermediate rotation.
	FileNextIssuerCSR = "issuer.next.csr"
	// FileNextIssuerChain is the new key's chain, signed by the root,
	// until the rotation is finished and it becomes issuer.crt.
	FileNextIssuerChain = "issuer.next.crt"
	// FileCAKey is the OS CA key of the file backend (gencreds only).
	FileCAKey = "os-ca.key"
	// FileServerCert is trustd's TLS serving certificate.
	FileServerCert = "server.crt"
	// FileServerKey is its private key.
	FileServerKey = "server.key"
	// FileToken is the worker join token (machine.token).
	FileToken = "token"
	// FileAcceptedCAs holds CAs trusted besides os-ca.crt (during a rotation).
	FileAcceptedCAs = "accepted-cas.crt"
	// FileTrustStatement is the root's signed statement naming the CAs
	// of accepted-cas.crt it vouches for (TrustStatement); the daemon
	// serves no other accepted CA.
	FileTrustStatement = "accepted-cas.statement.json"
	// FileNextCACert is the new CA of a rotation in progress.
	FileNextCACert = "os-ca.next.crt"
	// FileKubernetesSecret is the Secret manifest for the daemon's cert dir.
	FileKubernetesSecret = "kubernetes-secret.yaml"
	// FileWorkerPatch is the worker machine-config fragment.
	FileWorkerPatch = "worker-machineconfig-patch.yaml"
	// DirReceipts holds the ceremony receipts.
	DirReceipts = "receipts"
)

// TokenBytes is the entropy of a generated worker token.
const TokenBytes = 32

// NewToken returns TokenBytes random bytes from r, hex encoded.
func NewToken(r io.Reader) (string, error) {
	b := make([]byte, TokenBytes)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", fmt.Errorf("generate token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// TokenLines returns the tokens of a token file: one per line, surrounding
// space trimmed, blank lines skipped — the daemon's reading.
func TokenLines(content string) []string {
	var out []string
	for line := range strings.Lines(content) {
		if t := strings.TrimSpace(line); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// TokenFile renders a token file: every token of content on a line of its
// own, each ending with a newline, so that `openssl rand -hex 32 >> token`
// adds a line rather than lengthening the last token.
func TokenFile(content string) []byte {
	var b strings.Builder
	for _, t := range TokenLines(content) {
		b.WriteString(t + "\n")
	}
	return []byte(b.String())
}

// NewestToken is the token a worker patch carries: the last line of the
// token file, where a rotation appends the new token. Empty without one.
func NewestToken(content string) string {
	lines := TokenLines(content)
	if len(lines) == 0 {
		return ""
	}
	return lines[len(lines)-1]
}

// Reader reads a file of a certificate directory by name; a missing file
// is an error wrapping fs.ErrNotExist. keystore.Dir implements it.
type Reader interface {
	ReadFile(name string) ([]byte, error)
}

// OSDir is a Reader on a local directory.
type OSDir string

// ReadFile implements Reader.
func (d OSDir) ReadFile(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join(string(d), name))
}
