package keystore

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"go.yaml.in/yaml/v4"

	"github.com/steward-trustd/steward-trustd/internal/atomicfile"
	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// ThrowawayOSCAName is the CommonName of the throwaway certs.os pair in a
// worker secrets file: anyone who decodes it reads what it is.
const ThrowawayOSCAName = "THROWAWAY not the OS CA - the OS CA key is on the trustd device"

// throwawayComment heads certs.os in the worker secrets file.
const throwawayComment = `THROWAWAY pair written by steward-trustd-ceremony import: the real OS CA key
is on the trustd device and never leaves it. talosctl gen config validates
certs.os as a key pair, so this one stands in. Worker configs made from this
file need --config-patch-worker @worker-machineconfig-patch.yaml (the real
machine.ca crt and the token); never use it for control-plane configs or a
talosconfig: talosconfig credentials come from steward-trustd-ceremony talosconfig.`

// TalosWorkerSecrets returns a `talosctl gen secrets` bundle with certs.os
// replaced by a throwaway P-256 CA pair (named ThrowawayOSCAName, commented
// as such) and every other secret kept as it was: what
// `talosctl gen config --with-secrets` needs once the OS CA key lives on a
// device (it validates certs.os as a parseable key and certificate and
// signs a talosconfig with it). Workers get the real CA from the worker
// patch.
func TalosWorkerSecrets(secretsYAML []byte, now time.Time, r io.Reader) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(secretsYAML, &doc); err != nil {
		return nil, fmt.Errorf("talos secrets: %w", err)
	}
	keyNode, osNode, err := certsOS(&doc)
	if err != nil {
		return nil, err
	}
	crt, key, err := throwawayPair(now, r)
	if err != nil {
		return nil, err
	}
	setScalar(osNode, "crt", base64.StdEncoding.EncodeToString(crt))
	setScalar(osNode, "key", base64.StdEncoding.EncodeToString(key))
	keyNode.HeadComment = throwawayComment
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(4) // talosctl gen secrets' indentation
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("talos secrets: %w", err)
	}
	return out.Bytes(), enc.Close()
}

// IsTalosWorkerSecrets reports whether data is TalosWorkerSecrets' output
// for source: everything but certs.os equal, certs.os a throwaway pair.
// A resumed import keeps such a file instead of writing a new throwaway.
func IsTalosWorkerSecrets(data, source []byte) bool {
	a, b := withoutCertsOS(data), withoutCertsOS(source)
	if a == nil || b == nil || !bytes.Equal(a, b) {
		return false
	}
	c, err := talosSecretsCert(data)
	return err == nil && isThrowaway(c)
}

// talosSecretsCert returns certs.os.crt of a secrets bundle.
func talosSecretsCert(data []byte) (*x509.Certificate, error) {
	var s talosSecrets
	if err := yaml.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("talos secrets: %w", err)
	}
	if s.Certs.OS == nil {
		return nil, errors.New("talos secrets: no certs.os")
	}
	crt, err := base64.StdEncoding.DecodeString(s.Certs.OS.Crt)
	if err != nil {
		return nil, fmt.Errorf("talos secrets: certs.os.crt: %w", err)
	}
	return pki.ParseCertificate(crt)
}

// withoutCertsOS re-encodes data with certs.os emptied, for comparison; nil
// if it is not a secrets bundle.
func withoutCertsOS(data []byte) []byte {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil {
		return nil
	}
	keyNode, osNode, err := certsOS(&doc)
	if err != nil {
		return nil
	}
	keyNode.HeadComment, osNode.Content = "", nil
	out, err := yaml.Marshal(&doc)
	if err != nil {
		return nil
	}
	return out
}

// certsOS finds the certs.os key and mapping nodes of a secrets bundle.
func certsOS(doc *yaml.Node) (*yaml.Node, *yaml.Node, error) {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, nil, errors.New("talos secrets: not one YAML document (is this a `talosctl gen secrets` file?)")
	}
	_, certs := mappingValue(doc.Content[0], "certs")
	k, os := mappingValue(certs, "os")
	if os == nil || os.Kind != yaml.MappingNode {
		return nil, nil, errors.New("talos secrets: no certs.os mapping (is this a `talosctl gen secrets` file?)")
	}
	return k, os, nil
}

// mappingValue returns the key and value nodes of name in mapping m.
func mappingValue(m *yaml.Node, name string) (*yaml.Node, *yaml.Node) {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil, nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == name {
			return m.Content[i], m.Content[i+1]
		}
	}
	return nil, nil
}

// setScalar sets name in mapping m to the string v, adding it if absent.
func setScalar(m *yaml.Node, name, v string) {
	if _, n := mappingValue(m, name); n != nil {
		*n = yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v}
		return
	}
	m.Content = append(m.Content,
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: name},
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v})
}

// throwawayPair makes a self-signed P-256 CA named ThrowawayOSCAName and
// returns its certificate and SEC1 key as PEM (Talos's own key encodings).
func throwawayPair(now time.Time, r io.Reader) ([]byte, []byte, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), r)
	if err != nil {
		return nil, nil, fmt.Errorf("throwaway certs.os key: %w", err)
	}
	ca, err := pki.NewCACertificate(k, pki.CAOptions{Cluster: ThrowawayOSCAName, Organization: "steward-trustd throwaway"}, now, r)
	if err != nil {
		return nil, nil, fmt.Errorf("throwaway certs.os certificate: %w", err)
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, nil, fmt.Errorf("throwaway certs.os key: %w", err)
	}
	return pki.EncodeCertificates(ca), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// isThrowaway reports a certificate made by throwawayPair.
func isThrowaway(c *x509.Certificate) bool {
	return c != nil && c.Subject.CommonName == ThrowawayOSCAName
}

// WriteTalosWorkerSecrets writes TalosWorkerSecrets(source) to path (mode
// 0600, atomically). A file already there that is this source's worker
// secrets file (an interrupted or repeated import) is kept and kept is
// true; any other file is refused unless force.
func WriteTalosWorkerSecrets(path string, source []byte, force bool, now time.Time, r io.Reader) (kept bool, err error) {
	existing, err := os.ReadFile(path)
	switch {
	case err == nil && IsTalosWorkerSecrets(existing, source):
		return true, nil
	case err == nil && !force:
		return false, fmt.Errorf("%w: %s is not the worker secrets file of this secrets.yaml: move it away, name another with --talos-secrets-out, or replace it with --force", ErrExists, path)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return false, fmt.Errorf("worker secrets file: %w", err)
	}
	data, err := TalosWorkerSecrets(source, now, r)
	if err != nil {
		return false, err
	}
	return false, atomicfile.Write(path, data, 0o600, force)
}
