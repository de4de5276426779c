package keystore

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// clusterFileNames are the files of a ceremony directory an operation
// reads into its state (and may rewrite).
var clusterFileNames = []string{
	certdir.FileCACert, certdir.FileNextCACert, certdir.FileAcceptedCAs, certdir.FileTrustStatement, certdir.FileToken,
	certdir.FileServerCert, certdir.FileServerKey, certdir.FileWorkerPatch, certdir.FileKubernetesSecret,
}

// state is everything an operation reads from the ceremony directory,
// read once at its start: the planning functions decide from it alone.
type state struct {
	// dir is where the state was read (for messages).
	dir Dir
	// files holds the content of each present file of clusterFileNames.
	files map[string][]byte
	// ca and next are os-ca.crt and os-ca.next.crt; caErr is why os-ca.crt
	// did not parse (only --force may replace such a file).
	ca, next *x509.Certificate
	caErr    error
	// accepted is accepted-cas.crt.
	accepted []*x509.Certificate
	// token is the trimmed token file.
	token string
	// receipts are the receipts, oldest first; receiptNames is the highest
	// sequence number of a receipt file (the next receipt's follows it).
	receipts     []Receipt
	receiptNames int
	// intents are the outstanding key intent records, by operation.
	intents map[Operation]*intent
	// cleaned says which stale temporary files were removed.
	cleaned []string
	// earlier is what the operation committed before its own files (an
	// approval for the key it creates), for its Outcome.
	earlier Outcome
}

// readState reads the ceremony directory d.
func readState(d Dir) (*state, error) {
	st := &state{dir: d, files: map[string][]byte{}, intents: map[Operation]*intent{}}
	for _, n := range clusterFileNames {
		b, err := readOptional(d, n)
		if err != nil {
			return nil, err
		}
		if b != nil {
			st.files[n] = b
		}
	}
	if err := st.parse(); err != nil {
		return nil, err
	}
	names, err := d.List(certdir.DirReceipts)
	if err != nil {
		return nil, fmt.Errorf("list receipts: %w", err)
	}
	st.receiptNames = lastSequence(names)
	if st.receipts, err = ReadReceipts(d); err != nil {
		return nil, err
	}
	for _, op := range []Operation{opInitKey, opRotateKey, opIntermediateKey} {
		in, err := readIntent(d, op)
		if err != nil {
			return nil, err
		}
		if in != nil {
			st.intents[op] = in
		}
	}
	return st, nil
}

// lastSequence is the highest sequence number among the receipt file
// names. Not a count of the files: intent records live in the same
// directory and disappear, and a count would then hand out a number
// already taken.
func lastSequence(names []string) int {
	last := 0
	for _, n := range names {
		seq, _, ok := strings.Cut(n, "-")
		if v, err := strconv.Atoi(seq); ok && strings.HasSuffix(n, ".json") && err == nil && v > last {
			last = v
		}
	}
	return last
}

// parse decodes the certificates and the token of st.files.
func (st *state) parse() error {
	d := st.dir
	if b, ok := st.files[certdir.FileCACert]; ok {
		st.ca, st.caErr = pki.ParseCertificate(b)
		if st.caErr != nil {
			st.caErr = fmt.Errorf("%s: %w", d.Path(certdir.FileCACert), st.caErr)
		}
	}
	if b, ok := st.files[certdir.FileNextCACert]; ok {
		next, err := pki.ParseCertificate(b)
		if err != nil {
			return fmt.Errorf("%s: %w", d.Path(certdir.FileNextCACert), err)
		}
		st.next = next
	}
	if b, ok := st.files[certdir.FileAcceptedCAs]; ok {
		acc, err := pki.ParseCertificates(b)
		if err != nil {
			return fmt.Errorf("%s: %w", d.Path(certdir.FileAcceptedCAs), err)
		}
		st.accepted = acc
	}
	st.token = strings.TrimSpace(string(st.files[certdir.FileToken]))
	return nil
}

// has reports whether any of names is present.
func (st *state) has(names ...string) bool {
	for _, n := range names {
		if _, ok := st.files[n]; ok {
			return true
		}
	}
	return false
}

// receipt returns the newest receipt of operation op for the key
// fingerprint keyFP and, unless certFP is empty, that certificate.
func (st *state) receipt(op Operation, keyFP, certFP string) *Receipt {
	for i := len(st.receipts) - 1; i >= 0; i-- {
		r := &st.receipts[i]
		if r.Operation == op && (keyFP == "" || r.KeyFingerprint == keyFP) && (certFP == "" || r.CertificateFingerprint == certFP) {
			return r
		}
	}
	return nil
}

// recorded reports whether a receipt of operation op lists the file at
// path (an absolute path, as receipts list them).
func (st *state) recorded(op Operation, path string) bool {
	for _, r := range st.receipts {
		if r.Operation == op && slices.Contains(r.Files, path) {
			return true
		}
	}
	return false
}

// matches reports whether the directory already holds exactly files
// (written ones with that content, removed ones absent).
func (st *state) matches(files []File) bool {
	for _, f := range files {
		got, ok := st.files[f.Name]
		if f.Remove == ok || (!f.Remove && string(got) != string(f.Data)) {
			return false
		}
	}
	return true
}

// present lists, as paths, the files of files that exist in the state.
func (st *state) present(files []File) []string {
	var out []string
	for _, f := range files {
		if _, ok := st.files[f.Name]; ok && !f.Remove {
			out = append(out, st.dir.Path(f.Name))
		}
	}
	return out
}

// serverFiles returns server.crt and server.key if both exist.
func (st *state) serverFiles() map[string][]byte {
	crt, okc := st.files[certdir.FileServerCert]
	key, okk := st.files[certdir.FileServerKey]
	if !okc || !okk {
		return nil
	}
	return map[string][]byte{certdir.FileServerCert: crt, certdir.FileServerKey: key}
}

// currentCA returns os-ca.crt and the token, which every operation on an
// existing CA needs.
func (st *state) currentCA() (*x509.Certificate, string, error) {
	switch {
	case st.caErr != nil:
		return nil, "", st.caErr
	case st.ca == nil:
		return nil, "", fmt.Errorf("read the current CA: %s: %w (run init or import first)", st.dir.Path(certdir.FileCACert), fs.ErrNotExist)
	case st.token == "":
		return nil, "", errors.New(st.dir.Path(certdir.FileToken) + " is missing or empty")
	}
	return st.ca, st.token, nil
}
