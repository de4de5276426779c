package issuelog

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/steward-trustd/steward-trustd/internal/atomicfile"
)

// sigCosignature is the C2SP signed-note type of a timestamped Ed25519
// witness cosignature (c2sp.org/tlog-cosignature).
const sigCosignature byte = 0x04

// DirWitnessed holds, in a witness's state directory, every checkpoint
// it cosigned, by tree size.
const DirWitnessed = "witnessed"

// Cosigner cosigns checkpoints as a witness (another replica's operator):
// Ed25519 over "cosignature/v1\ntime T\n" and the checkpoint text, the
// signature preceded by T as a big-endian 64-bit count of seconds.
type Cosigner struct {
	name string
	id   uint32
	key  crypto.Signer
	pub  ed25519.PublicKey
	now  func() time.Time
}

// NewCosigner wraps an Ed25519 key (a file or PKCS#11 key: TPMs hold no
// Ed25519) as the witness named name.
func NewCosigner(name string, key crypto.Signer, now func() time.Time) (*Cosigner, error) {
	pub, ok := key.Public().(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("witness key type %T: C2SP cosignatures are Ed25519; create the key with --algorithm ed25519", key.Public())
	}
	if !validName(name) {
		return nil, fmt.Errorf("witness name %q: printable text without spaces or '+'", name)
	}
	return &Cosigner{name: name, id: keyID(name, sigCosignature, pub), key: key, pub: pub, now: now}, nil
}

// Name implements note.Signer.
func (c *Cosigner) Name() string { return c.name }

// KeyHash implements note.Signer (key ID as for Ed25519, with type 0x04).
func (c *Cosigner) KeyHash() uint32 { return c.id }

// Sign implements note.Signer.
func (c *Cosigner) Sign(msg []byte) ([]byte, error) {
	t := uint64(c.now().Unix())
	sig, err := c.key.Sign(rand.Reader, cosignedMessage(t, msg), crypto.Hash(0))
	if err != nil {
		return nil, fmt.Errorf("witness key: %w", err)
	}
	return append(binary.BigEndian.AppendUint64(nil, t), sig...), nil
}

func cosignedMessage(t uint64, checkpoint []byte) []byte {
	return append([]byte("cosignature/v1\ntime "+strconv.FormatUint(t, 10)+"\n"), checkpoint...)
}

// Verifier is the witness's verifier key: name+hex(key ID)+base64(0x04 || key).
func (c *Cosigner) Verifier() string {
	return fmt.Sprintf("%s+%08x+%s", c.name, c.id, base64.StdEncoding.EncodeToString(append([]byte{sigCosignature}, c.pub...)))
}

// Witness checks the log s against every checkpoint the witness cosigned
// before (kept in stateDir): the log must verify with them, so a log
// rewritten, cut or forked since is refused. It then cosigns the latest
// checkpoint, keeps it, and returns it with both signatures.
func Witness(s *Snapshot, logVKey string, c *Cosigner, stateDir string) ([]byte, *Report, error) {
	dir := filepath.Join(stateDir, DirWitnessed)
	seen, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, p := range seen {
		if b, err := os.ReadFile(p); err == nil {
			s.Checkpoints["witnessed "+p] = b
		}
	}
	r, err := Verify(s, logVKey)
	if err != nil {
		return nil, nil, err
	}
	if !r.OK() {
		return nil, r, fmt.Errorf("witness: the log does not verify against the %d checkpoint(s) cosigned before: %s", len(seen), r.Problems[0])
	}
	v, err := NewVerifier(logVKey)
	if err != nil {
		return nil, nil, err
	}
	n, err := note.Open(r.Latest.Raw, note.VerifierList(v))
	if err != nil {
		return nil, nil, err
	}
	n.UnverifiedSigs = nil // a checkpoint from the log carries no one else's signature we vouch for
	out, err := note.Sign(n, c)
	if err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	return out, r, atomicfile.Write(filepath.Join(dir, strconv.FormatInt(r.Latest.Size, 10)), out, 0o644, true)
}

// CheckCosignature verifies the witness's cosignature on a checkpoint.
func CheckCosignature(checkpoint []byte, witnessVKey string) (time.Time, error) {
	v, err := newCosignatureVerifier(witnessVKey)
	if err != nil {
		return time.Time{}, err
	}
	n, err := note.Open(checkpoint, note.VerifierList(v))
	if err != nil {
		return time.Time{}, fmt.Errorf("no valid cosignature of %s: %w", v.name, err)
	}
	for _, sg := range n.Sigs {
		if raw, err := base64.StdEncoding.DecodeString(sg.Base64); err == nil && len(raw) >= 12 {
			return time.Unix(int64(binary.BigEndian.Uint64(raw[4:12])), 0), nil
		}
	}
	return time.Time{}, errors.New("cosignature without a timestamp")
}

type cosignatureVerifier struct {
	name string
	id   uint32
	pub  ed25519.PublicKey
}

func newCosignatureVerifier(vkey string) (*cosignatureVerifier, error) {
	name, id, raw, err := splitVerifier(vkey)
	if err != nil {
		return nil, err
	}
	if raw[0] != sigCosignature || len(raw) != 1+ed25519.PublicKeySize || keyID(name, raw[0], raw[1:]) != id {
		return nil, errors.New("witness verifier key: want NAME+KEYID+base64(0x04 || Ed25519 key) as log witness prints it")
	}
	return &cosignatureVerifier{name: name, id: id, pub: ed25519.PublicKey(raw[1:])}, nil
}

func (v *cosignatureVerifier) Name() string    { return v.name }
func (v *cosignatureVerifier) KeyHash() uint32 { return v.id }
func (v *cosignatureVerifier) Verify(msg, sig []byte) bool {
	if len(sig) != 8+ed25519.SignatureSize {
		return false
	}
	return ed25519.Verify(v.pub, cosignedMessage(binary.BigEndian.Uint64(sig), msg), sig[8:])
}
