package keystore

import (
	"bytes"
	"crypto/x509"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// clusterFiles builds the cluster-level outputs derived from the CA state
// (token is the token file's content, one token per line):
// the root's trust statement (or its removal when nil), os-ca.crt, token,
// accepted-cas.crt (or its removal), the Kubernetes Secret (the daemon's
// cert dir without any CA key; server.crt/server.key included when given)
// and the worker patch. The statement goes first: a run killed before
// os-ca.crt is rewritten leaves a statement by a root the directory
// still names (os-ca.next.crt during a rotation's finish).
func clusterFiles(cluster string, ca *x509.Certificate, accepted []*x509.Certificate, token string, server map[string][]byte, statement []byte) ([]File, error) {
	if cluster == "" {
		cluster = "talos"
	}
	caPEM := pki.EncodeCertificates(ca)
	tokenFile := certdir.TokenFile(token)
	content := map[string][]byte{certdir.FileCACert: caPEM, certdir.FileToken: tokenFile}
	files := []File{{Name: certdir.FileTrustStatement, Remove: true}}
	if statement != nil {
		content[certdir.FileTrustStatement] = statement
		files[0] = File{Name: certdir.FileTrustStatement, Data: statement, Mode: 0o644}
	}
	files = append(files,
		File{Name: certdir.FileCACert, Data: caPEM, Mode: 0o644},
		File{Name: certdir.FileToken, Data: tokenFile, Mode: 0o600},
	)
	if len(accepted) > 0 {
		acc := pki.EncodeCertificates(accepted...)
		content[certdir.FileAcceptedCAs] = acc
		files = append(files, File{Name: certdir.FileAcceptedCAs, Data: acc, Mode: 0o644})
	} else {
		files = append(files, File{Name: certdir.FileAcceptedCAs, Remove: true})
	}
	for n, b := range server {
		content[n] = b
	}
	secret, err := certdir.KubernetesSecret(cluster, content)
	if err != nil {
		return nil, err
	}
	// One token, never several: a machine.token of two lines is valid
	// config that Talos's client never sends.
	patch, err := WorkerPatch(certdir.NewestToken(token), ca, accepted)
	if err != nil {
		return nil, err
	}
	return append(files,
		File{Name: certdir.FileWorkerPatch, Data: patch, Mode: 0o600},
		File{Name: certdir.FileKubernetesSecret, Data: secret, Mode: 0o600},
	), nil
}

// without is certs less the certificates in drop.
func without(certs []*x509.Certificate, drop ...*x509.Certificate) []*x509.Certificate {
	var out []*x509.Certificate
	for _, c := range certs {
		keep := true
		for _, d := range drop {
			if d != nil && bytes.Equal(c.Raw, d.Raw) {
				keep = false
			}
		}
		if keep {
			out = append(out, c)
		}
	}
	return out
}
