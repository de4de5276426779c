package tpm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/internal/atomicfile"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// CreationSuffix is appended to a key blob's path to name its creation
// evidence file: the TPMS_CREATION_DATA, creation hash and creation
// ticket TPM2_Create returned (TPM 2.0 Part 3 §12.1), which
// TPM2_CertifyCreation (§18.3) needs to attest the key later. The
// ticket is an HMAC under the owner hierarchy's proof, valid until the
// owner hierarchy is cleared (which destroys the key anyway). Nothing in
// it is secret; the file is written 0644.
const CreationSuffix = ".creation.json"

// creationLabel is the creation data's outsideInfo: it says what the
// key is for in every attestation of it.
const creationLabel = "steward-trustd OS CA"

// creationEvidence is the creation evidence file.
type creationEvidence struct {
	Version int `json:"version"`
	// KeyName is the key's TPM name, so that evidence beside another key
	// is recognised as stale.
	KeyName        []byte `json:"keyName"`
	CreationData   []byte `json:"creationData"`
	CreationHash   []byte `json:"creationHash"`
	CreationTicket []byte `json:"creationTicket"`
}

// CreationPath is the creation evidence file of a key blob.
func CreationPath(blobPath string) string { return blobPath + CreationSuffix }

// persistWithEvidence stores a new blob key and, beside it, its creation
// evidence. The evidence goes first (replacing a stale file of a key
// deleted by hand: checkFree saw no blob), so that a blob never exists
// without it; it is removed again if the blob cannot be written. A
// persistent-handle key keeps no evidence (there is no file to put it
// beside) and is reported not attestable.
func (b *Backend) persistWithEvidence(t transport.TPM, u KeyURI, parent *srk, blob *tpmpolicy.KeyBlob, rsp *tpm2.CreateResponse) error {
	if u.Path == "" {
		return b.persist(t, u, parent, blob)
	}
	name, err := tpm2.ObjectName(mustContents(rsp.OutPublic))
	if err != nil {
		return fmt.Errorf("key name: %w", err)
	}
	data, err := json.MarshalIndent(creationEvidence{
		Version: 1, KeyName: name.Buffer,
		CreationData:   rsp.CreationData.Bytes(),
		CreationHash:   rsp.CreationHash.Buffer,
		CreationTicket: tpm2.Marshal(rsp.CreationTicket),
	}, "", "  ")
	if err != nil {
		return err
	}
	// A run killed while replacing the record left its temporary link
	// here, in a key directory no ceremony lock cleans: this run, which
	// holds the key's name (checkFree), removes it.
	if _, err := atomicfile.RemoveStaleTempsOf(CreationPath(u.Path)); err != nil {
		return fmt.Errorf("write creation evidence: %w", err)
	}
	if err := atomicfile.Write(CreationPath(u.Path), append(data, '\n'), 0o644, true); err != nil {
		return fmt.Errorf("write creation evidence: %w", err)
	}
	if err := b.persist(t, u, parent, blob); err != nil {
		return errors.Join(err, os.Remove(CreationPath(u.Path)))
	}
	return nil
}

// mustContents decodes a public area the TPM just returned; a TPM that
// returns an undecodable one fails the name computation instead.
func mustContents(p tpm2.TPM2BPublic) *tpm2.TPMTPublic {
	pub, err := p.Contents()
	if err != nil {
		return &tpm2.TPMTPublic{}
	}
	return pub
}

// ErrNotAttestable reports a key that cannot be attested: imported (its
// private key existed outside the TPM), a persistent handle, or created
// before creation evidence was kept.
var ErrNotAttestable = errors.New("key is not attestable")

// readCreation reads the creation evidence beside blobPath and checks
// that it belongs to the key named keyName.
func readCreation(blobPath string, keyName []byte) (*creationEvidence, error) {
	f, err := os.Open(CreationPath(blobPath))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: no creation evidence %s (the key was imported, or created before evidence was kept)", ErrNotAttestable, CreationPath(blobPath))
	}
	if err != nil {
		return nil, fmt.Errorf("read creation evidence: %w", err)
	}
	defer func() { _ = f.Close() }() // read only
	data, err := io.ReadAll(io.LimitReader(f, 1<<16))
	if err != nil {
		return nil, fmt.Errorf("read creation evidence: %w", err)
	}
	var ce creationEvidence
	if err := json.Unmarshal(data, &ce); err != nil || ce.Version != 1 {
		return nil, fmt.Errorf("%w: creation evidence %s is not a version 1 evidence file", ErrNotAttestable, CreationPath(blobPath))
	}
	if !bytes.Equal(ce.KeyName, keyName) {
		return nil, fmt.Errorf("%w: creation evidence %s belongs to another key", ErrNotAttestable, CreationPath(blobPath))
	}
	return &ce, nil
}

// Attestability says whether the key can be attested (created in this
// TPM as sensitiveDataOrigin|fixedTPM|fixedParent, with its creation
// evidence kept beside the blob) and, when not, why.
func (s *Signer) Attestability() (bool, string) {
	if s.km.blob == nil {
		return false, "a persistent-handle key keeps no creation evidence"
	}
	pub, err := s.km.blob.Public.Contents()
	if err != nil {
		return false, err.Error()
	}
	if a := pub.ObjectAttributes; !a.SensitiveDataOrigin || !a.FixedTPM || !a.FixedParent {
		return false, "the key was imported: its private key existed outside the TPM"
	}
	if _, err := readCreation(s.uri.Path, s.name.Buffer); err != nil {
		return false, err.Error()
	}
	return true, "created in the TPM; creation evidence in " + CreationPath(s.uri.Path)
}
