package keystore

import (
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// Receipt records one ceremony operation. It never holds a secret: no key,
// no token, no PIN, and no key URI (a pkcs11: URI may carry a pin-value);
// the key is identified by its fingerprint and Location instead.
type Receipt struct {
	// Time of the operation, UTC.
	Time time.Time `json:"time"`
	// Operation names the operation (keystore/operation.go lists them).
	Operation Operation `json:"operation"`
	// ToolVersion is the ceremony binary's version.
	ToolVersion string `json:"toolVersion"`
	// Backend, KeyAlgorithm, KeyFingerprint, KeyLocation and Extractable
	// describe the CA key used (signer.Description).
	Backend        string `json:"backend"`
	KeyAlgorithm   string `json:"keyAlgorithm"`
	KeyFingerprint string `json:"keyFingerprint"`
	KeyLocation    string `json:"keyLocation,omitempty"`
	Extractable    bool   `json:"extractable"`
	// Policy and PolicyDigest are the key's use policy (TPM PCR selection).
	Policy       string `json:"policy,omitempty"`
	PolicyDigest string `json:"policyDigest,omitempty"`
	// CertificateFingerprint is the SHA-256 of the DER of the certificate
	// the operation issued or used, with its subject, serial and expiry.
	CertificateFingerprint string    `json:"certificateFingerprint,omitempty"`
	CertificateSubject     string    `json:"certificateSubject,omitempty"`
	CertificateSerial      string    `json:"certificateSerial,omitempty"`
	CertificateNotAfter    time.Time `json:"certificateNotAfter,omitzero"`
	// Files lists the absolute paths of the files written, in order, and
	// of those removed, prefixed with "-".
	Files []string `json:"files,omitempty"`
	// Details holds operation-specific, non-secret facts (roles, SANs,
	// the CA fingerprint a rotation replaces).
	Details map[string]string `json:"details,omitempty"`
}

// newReceipt is a receipt of op with key d; commit stamps its time, the
// tool's version and its files.
func newReceipt(op Operation, d signer.Description) Receipt {
	return Receipt{
		Operation:      op,
		Backend:        d.Backend,
		KeyAlgorithm:   d.Algorithm,
		KeyFingerprint: d.Fingerprint,
		KeyLocation:    d.Location,
		Extractable:    d.Extractable,
		Policy:         d.Policy,
		PolicyDigest:   d.PolicyDigest,
	}
}

// certReceipt records the certificate c an operation issued or used.
func certReceipt(r *Receipt, c *x509.Certificate) {
	r.CertificateFingerprint = pki.CertFingerprint(c)
	r.CertificateSubject = c.Subject.String()
	r.CertificateSerial = c.SerialNumber.Text(16)
	r.CertificateNotAfter = c.NotAfter.UTC()
}

// receiptFile renders r as a File under certdir.DirReceipts. The name starts
// with a sequence number (so receipts list in the order they were written,
// whatever the clock says) and carries random bits so that two receipts
// never collide.
func (st *state) receiptFile(r Receipt, rnd io.Reader) (File, error) {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return File{}, fmt.Errorf("marshal receipt: %w", err)
	}
	suffix := make([]byte, 4)
	if _, err := io.ReadFull(rnd, suffix); err != nil {
		return File{}, fmt.Errorf("receipt name: %w", err)
	}
	name := fmt.Sprintf("%06d-%s-%s-%s.json", st.receiptNames+1, r.Time.UTC().Format("20060102T150405.000000000Z"), r.Operation, hex.EncodeToString(suffix))
	return File{Name: path.Join(certdir.DirReceipts, name), Data: append(data, '\n'), Mode: 0o644}, nil
}

// add notes a receipt just written.
func (st *state) add(r Receipt) {
	st.receipts = append(st.receipts, r)
	st.receiptNames++
}

// ReadReceipts returns the receipts in d, oldest first. A receipt that
// does not parse is reported, not skipped: receipts are the audit trail.
func ReadReceipts(d Dir) ([]Receipt, error) {
	names, err := d.List(certdir.DirReceipts)
	if err != nil {
		return nil, fmt.Errorf("list receipts: %w", err)
	}
	var out []Receipt
	var errs []error
	for _, n := range names {
		if !strings.HasSuffix(n, ".json") {
			continue
		}
		data, err := d.ReadFile(path.Join(certdir.DirReceipts, n))
		if err != nil {
			errs = append(errs, fmt.Errorf("read receipt %s: %w", n, err))
			continue
		}
		var r Receipt
		if err := json.Unmarshal(data, &r); err != nil {
			errs = append(errs, fmt.Errorf("parse receipt %s: %w", n, err))
			continue
		}
		out = append(out, r)
	}
	return out, errors.Join(errs...)
}
