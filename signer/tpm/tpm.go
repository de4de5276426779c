// Package tpm is the signer backend that keeps the CA key inside a TPM 2.0.
// The key is an ECDSA P-256 (or P-384) key created in the TPM, or imported
// into it, under the owner hierarchy's storage root key; its private half
// leaves the TPM only encrypted to that SRK. Every signature runs a policy
// session: PolicyPCR over a sha256 PCR selection, then
// PolicyCommandCode(TPM2_Sign). The package never opens a device: the
// Backend's Dial function does (cmd/internal/tpmdev for real TPMs and swtpm
// sockets, tpmsim for tests).
//
// # Key URI grammar
//
//	tpm-uri   = "tpm:" attr *( ";" attr )
//	attr      = key "=" value          ; each key at most once, value non-empty
//	key       = "path" | "handle" | "device" | "swtpm" | "socket" | "pcrs" | "timeout"
//	          | "approvals" | "authority"
//
//	path=/abs/clean/file.tpmkey   key blob file (TSS2 PRIVATE KEY PEM)
//	handle=0x81xxxxxx             persistent handle, owner range 0x81000000-0x817fffff
//	device=/dev/tpmrm0            TPM character device
//	swtpm=host:port               swtpm --server type=tcp socket
//	socket=/abs/path              swtpm --server type=unixio socket
//	pcrs=7,11                     sha256 PCRs the key is bound to, 0-23 (default 7)
//	timeout=5s                    bound on each TPM operation (default 10s)
//	approvals=/abs/dir            approvals directory of a key under a policy authority
//	authority=B64URL[,B64URL]     creation only: policy authorities (see WithAuthorities)
//
// Exactly one of path and handle is required; at most one of device, swtpm
// and socket may be given (none means /dev/tpmrm0, else /dev/tpm0). Unknown
// or repeated attributes, empty values and relative or unclean paths are
// errors wrapping signer.ErrInvalidURI. pcrs chooses the selection for
// Generate and Import; for Open the selection comes from the key blob and
// a pcrs attribute, if given, must equal it. A persistent handle carries no
// blob, so for handle= keys the pcrs attribute (default 7) names the
// selection, and a wrong one shows as an unsatisfied policy.
//
// A key created under policy authorities (signed PCR policies) has the
// policy PolicyAuthorize(authority, policyRef) -> PolicyCommandCode(Sign)
// (PolicyOR of such branches for several authorities) and signs in any
// PCR state an authority approved in a file of its approvals directory;
// the policyRef binds the key's PCR selection (binding.go); see
// authorized.go and README.md.
//
// Examples:
//
//	tpm:path=/etc/steward-trustd/os-ca.tpmkey;device=/dev/tpmrm0
//	tpm:handle=0x81000100;pcrs=7,11
//	tpm:path=/var/lib/trustd/ca.tpmkey;swtpm=127.0.0.1:2321;timeout=2s
package tpm

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/internal/atomicfile"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// DialFunc opens a connection to the TPM a key URI names. The backend calls
// it when a key is opened and again to reconnect after the TPM went away.
type DialFunc func(ctx context.Context, dev Device) (transport.TPMCloser, error)

// DefaultRetryInterval is the least time between two reconnection attempts.
const DefaultRetryInterval = 500 * time.Millisecond

// Backend opens, generates and imports TPM keys.
type Backend struct {
	// Dial opens the TPM. It is required: this package opens no device.
	Dial DialFunc
	// Logger receives one line per change of device or policy state
	// (never per request). Nil discards.
	Logger *slog.Logger
	// Rand is the entropy source for Import's seed; nil means crypto/rand.
	Rand io.Reader
	// RetryInterval is the least time between reconnection attempts; a
	// call within it fails at once with signer.ErrDeviceUnavailable.
	// Zero means DefaultRetryInterval.
	RetryInterval time.Duration
	// ApprovalsReload is how often (at most) the approvals directory of a
	// key under policy authorities is re-read; zero means
	// DefaultApprovalsReload.
	ApprovalsReload time.Duration
}

// Scheme implements signer.Backend.
func (b *Backend) Scheme() string { return Scheme }

func (b *Backend) logger() *slog.Logger {
	if b.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return b.Logger
}

// dial opens the URI's device with its timeout.
func (b *Backend) dial(ctx context.Context, u KeyURI) (transport.TPMCloser, error) {
	if b.Dial == nil {
		return nil, errors.New("tpm backend has no Dial function (a build without TPM device support)")
	}
	ctx, cancel := context.WithTimeout(ctx, u.Timeout)
	defer cancel()
	conn, err := b.Dial(ctx, u.Device)
	if err != nil {
		return nil, fmt.Errorf("tpm: open %s: %w: %w", u.Device, signer.ErrDeviceUnavailable, err)
	}
	return conn, nil
}

// withConn runs op on a fresh connection to u's TPM, bounded by u.Timeout,
// and closes the connection.
func (b *Backend) withConn(ctx context.Context, u KeyURI, op func(t transport.TPM) error) error {
	conn, err := b.dial(ctx, u)
	if err != nil {
		return err
	}
	dead, err := runBounded(ctx, conn, u.Timeout, op)
	// A dead connection's close fails too; err already says why.
	if cerr := conn.Close(); !dead {
		err = errors.Join(err, cerr)
	}
	return err
}

// runBounded runs op against conn and gives up after timeout or when ctx
// ends, closing conn so that a blocked read returns. A transport failure
// (or a timeout) is reported wrapping signer.ErrDeviceUnavailable, with
// dead set so that the caller drops conn.
func runBounded(ctx context.Context, conn transport.TPMCloser, timeout time.Duration, op func(t transport.TPM) error) (dead bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rec := &recordingTPM{t: conn}
	done := make(chan error, 1)
	go func() { done <- op(rec) }()
	select {
	case err := <-done:
		if rec.failure() != nil {
			return true, fmt.Errorf("%w: %w", signer.ErrDeviceUnavailable, err)
		}
		return false, err
	case <-ctx.Done():
		_ = conn.Close() // abandons the TPM that did not answer
		return true, fmt.Errorf("%w: TPM did not answer within %v: %w", signer.ErrDeviceUnavailable, timeout, ctx.Err())
	}
}

// recordingTPM remembers whether the transport itself failed, which tells
// a dead device from a TPM that answered with an error code.
type recordingTPM struct {
	t   transport.TPM
	mu  sync.Mutex
	err error
}

func (r *recordingTPM) Send(cmd []byte) ([]byte, error) {
	rsp, err := r.t.Send(cmd)
	if err != nil {
		r.mu.Lock()
		if r.err == nil {
			r.err = err
		}
		r.mu.Unlock()
	}
	return rsp, err
}

func (r *recordingTPM) failure() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Open implements signer.Backend.
func (b *Backend) Open(ctx context.Context, uri string) (signer.Signer, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	var k *keyMaterial
	if u.Path != "" {
		k, err = readBlobFile(u)
		if err != nil {
			return nil, err
		}
	} else {
		k = &keyMaterial{pcrs: u.PCRs, authorities: u.Authorities, binding: u.binding()}
	}
	if err := b.attachApprovals(u, k); err != nil {
		return nil, err
	}
	if w := k.binding.Weakness(); w != "" && len(k.authorities) > 0 {
		b.logger().Warn("tpm: weak key policy", "location", u.String(), "binding", k.binding.String(), "detail", w)
	}
	return b.newSigner(ctx, u, k)
}

// keyMaterial is what a Signer knows about its key before connecting.
type keyMaterial struct {
	blob *tpmpolicy.KeyBlob // nil for a persistent handle
	pcrs []int
	// pcrDigest is the expected PCR digest, when a blob records it.
	pcrDigest []byte
	// authorities of a key under signed policies (nil for a PCR-bound
	// key), the PolicyOR branches when there are several, and the
	// approvals directory; binding is the policyRef of the key's
	// PolicyAuthorize and the PCR selection it binds.
	authorities []*tpmpolicy.Authority
	binding     tpmpolicy.Binding
	branches    [][]byte
	approvals   *tpmpolicy.ApprovalDir
}

// attachApprovals checks that a key under policy authorities has an
// approvals directory and a PCR-bound key has none, and prepares it.
func (b *Backend) attachApprovals(u KeyURI, k *keyMaterial) error {
	switch {
	case len(k.authorities) == 0 && u.Approvals != "":
		return fmt.Errorf("tpm: %s: approvals= applies to keys under a policy authority; this key is bound to fixed PCR values: %w", u, signer.ErrInvalidURI)
	case len(k.authorities) == 0:
		return nil
	case u.Approvals == "":
		return fmt.Errorf("tpm: %s: the key is under a policy authority; name its approvals directory with approvals=/dir: %w", u, signer.ErrInvalidURI)
	}
	_, branches, err := tpmpolicy.AuthorizedPolicy(k.authorities, k.binding.Ref())
	if err != nil {
		return err
	}
	k.branches = branches
	k.approvals = tpmpolicy.NewApprovalDir(u.Approvals, k.authorities, k.binding, b.ApprovalsReload, b.logger())
	return nil
}

func readBlobFile(u KeyURI) (*keyMaterial, error) {
	f, err := os.Open(u.Path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("tpm: open key blob %s: %w", u.Path, signer.ErrKeyNotFound)
		}
		return nil, fmt.Errorf("tpm: open key blob %s: %w", u.Path, err)
	}
	defer func() { _ = f.Close() }() // read only
	data, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("tpm: read key blob %s: %w", u.Path, err)
	}
	blob, err := tpmpolicy.ParseKeyBlob(data)
	if err != nil {
		return nil, fmt.Errorf("tpm: key blob %s: %w", u.Path, err)
	}
	if len(blob.Authorities) > 0 {
		if err := checkURIBinding(u, blob.Binding); err != nil {
			return nil, err
		}
		if blob.Binding.PCRs() == nil {
			blob.PCRs = u.PCRs // v1: the PCRs the ceremony reads and approves; any approval may name others
		}
	} else if u.PCRsSet && !slices.Equal(u.PCRs, blob.PCRs) {
		return nil, fmt.Errorf("tpm: key blob %s is bound to sha256 PCRs %s but the URI says pcrs=%s: %w",
			u.Path, tpmpolicy.PCRList(blob.PCRs), tpmpolicy.PCRList(u.PCRs), signer.ErrInvalidURI)
	}
	pub, err := blob.Public.Contents()
	if err != nil {
		return nil, fmt.Errorf("tpm: key blob %s: %w", u.Path, err)
	}
	if _, err := tpmpolicy.CheckKeyPublic(pub); err != nil {
		return nil, fmt.Errorf("tpm: key blob %s: %w", u.Path, err)
	}
	want, err := blob.AuthPolicy()
	if err != nil {
		return nil, err
	}
	if !slices.Equal(want, pub.AuthPolicy.Buffer) {
		return nil, fmt.Errorf("tpm: key blob %s: its recorded policy does not reproduce the key's authPolicy", u.Path)
	}
	if len(u.Authorities) > 0 && !tpmpolicy.SameAuthorities(u.Authorities, blob.Authorities) {
		return nil, fmt.Errorf("tpm: key blob %s is under other policy authorities than the URI's authority=: %w", u.Path, signer.ErrInvalidURI)
	}
	return &keyMaterial{blob: blob, pcrs: blob.PCRs, pcrDigest: blob.PCRDigest, authorities: blob.Authorities, binding: blob.Binding}, nil
}

// checkURIBinding checks a key URI against the binding its blob records.
func checkURIBinding(u KeyURI, b tpmpolicy.Binding) error {
	switch {
	case u.Systemd && !b.Systemd():
		return fmt.Errorf("tpm: key blob %s is not systemd-compatible (its policy is %s) but the URI says systemd=true: %w", u.Path, b, signer.ErrInvalidURI)
	case b.PCRs() != nil && u.PCRsSet && !slices.Equal(u.PCRs, b.PCRs()):
		return fmt.Errorf("tpm: key blob %s binds sha256 PCRs %s in its policy (%s) but the URI says pcrs=%s: %w",
			u.Path, tpmpolicy.PCRList(b.PCRs()), b, tpmpolicy.PCRList(u.PCRs), signer.ErrInvalidURI)
	}
	return checkURIRevocation(u, b)
}

// curveFor maps an algorithm to a TPM curve, refusing what a TPM cannot hold.
func curveFor(alg signer.Algorithm) (tpm2.TPMECCCurve, elliptic.Curve, error) {
	switch alg {
	case signer.ECDSAP256:
		return tpm2.TPMECCNistP256, elliptic.P256(), nil
	case signer.ECDSAP384:
		return tpm2.TPMECCNistP384, elliptic.P384(), nil
	case signer.Ed25519:
		return 0, nil, errEd25519()
	case signer.RSA2048, signer.RSA3072, signer.RSA4096:
		return 0, nil, errRSA(alg)
	}
	return 0, nil, fmt.Errorf("%w: %q", signer.ErrUnsupportedAlgorithm, alg)
}

// Generate implements signer.Backend: it creates an ECDSA key inside the
// TPM, bound to the URI's PCRs as they are now, and stores it as a key
// blob file (never replacing one) or at a free persistent handle.
func (b *Backend) Generate(ctx context.Context, uri string, alg signer.Algorithm) (signer.Signer, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	return b.generate(ctx, u, alg)
}

func (b *Backend) generate(ctx context.Context, u KeyURI, alg signer.Algorithm) (signer.Signer, error) {
	curve, _, err := curveFor(alg)
	if err != nil {
		return nil, err
	}
	if err := checkFree(u); err != nil {
		return nil, err
	}
	var blob *tpmpolicy.KeyBlob
	err = b.withConn(ctx, u, b.reclaiming(u, func(t transport.TPM) error {
		digest, policy, parent, err := prepareKey(t, u, curve)
		if err != nil {
			return err
		}
		defer flush(t, parent.handle)
		rsp, err := tpm2.Create{
			ParentHandle: parent.auth(),
			InPublic:     tpm2.New2B(tpmpolicy.KeyTemplate(curve, policy, false)),
			OutsideInfo:  tpm2.TPM2BData{Buffer: []byte(creationLabel)},
			CreationPCR:  tpmpolicy.PCRSelection(u.PCRs),
		}.Execute(t)
		if err != nil {
			return fmt.Errorf("create key (TPM2_Create): %w", err)
		}
		blob = &tpmpolicy.KeyBlob{Public: rsp.OutPublic, Private: rsp.OutPrivate, PCRs: u.PCRs, PCRDigest: digest, Authorities: u.Authorities, Binding: u.binding()}
		return b.persistWithEvidence(t, u, parent, blob, rsp)
	}))
	if err != nil {
		return nil, fmt.Errorf("tpm: generate %s key: %w", alg, err)
	}
	return b.finish(ctx, u, blob, "generated")
}

// reclaiming wraps a key-creating op: if the TPM is out of object or
// session memory because clients died holding handles (a ceremony killed
// on swtpm or /dev/tpm0, which have no resource manager), the handles are
// reclaimed as the signer's key load does (reclaimStale) and op runs once
// more. op leaves nothing loaded when it fails (the SRK and the new key
// are flushed, a blob is written last), so the second attempt starts clean
// and never makes a second key.
func (b *Backend) reclaiming(u KeyURI, op func(t transport.TPM) error) func(t transport.TPM) error {
	return func(t transport.TPM) error {
		err := op(t)
		if err != nil && reclaimStale(t, u.Device, err, b.logger()) {
			err = op(t)
		}
		return err
	}
}

// prepareKey does what creating and importing a key share: check that
// the TPM has the curve and the handle is free, bind the policy to the
// current values of the URI's PCRs, and create the SRK (the caller
// flushes it).
func prepareKey(t transport.TPM, u KeyURI, curve tpm2.TPMECCCurve) (pcrDigest, policy []byte, parent *srk, err error) {
	if err := checkCurveAndHandle(t, u, curve); err != nil {
		return nil, nil, nil, err
	}
	if len(u.Authorities) > 0 {
		// Signed policies: nothing depends on the PCRs' values now; the
		// selection is bound in the policyRef.
		if policy, _, err = tpmpolicy.AuthorizedPolicy(u.Authorities, u.binding().Ref()); err != nil {
			return nil, nil, nil, err
		}
		if err := ensureCounter(t, u.binding()); err != nil {
			return nil, nil, nil, err
		}
		parent, err = createSRK(t)
		return nil, policy, parent, err
	}
	values, err := ReadPCRs(t, u.PCRs)
	if err != nil {
		return nil, nil, nil, err
	}
	pcrDigest = tpmpolicy.PCRDigest(values)
	if policy, err = tpmpolicy.PCRAuthPolicy(u.PCRs, pcrDigest); err != nil {
		return nil, nil, nil, err
	}
	if parent, err = createSRK(t); err != nil {
		return nil, nil, nil, err
	}
	return pcrDigest, policy, parent, nil
}

// Import implements signer.Backend: it wraps an ECDSA private key to the
// TPM's SRK (TPM2_Import with an outer wrapper only, TPM 2.0 Part 1 §23.3.2
// "Outer Duplication Wrapper"), so that from then on only the TPM can use
// it, and verifies it by signing. The caller still holds the original key
// and must destroy it.
func (b *Backend) Import(ctx context.Context, uri string, key crypto.Signer) (signer.Signer, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	var priv *ecdsa.PrivateKey
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		priv = k
	case ed25519.PrivateKey:
		return nil, fmt.Errorf("tpm: import: %w", errEd25519())
	case *rsa.PrivateKey:
		return nil, fmt.Errorf("tpm: import: %w", errRSA(signer.Algorithm(fmt.Sprintf("rsa%d", k.N.BitLen()))))
	default:
		return nil, fmt.Errorf("tpm: import: %w: %T (want an ECDSA private key)", signer.ErrUnsupportedAlgorithm, key)
	}
	var curve tpm2.TPMECCCurve
	switch priv.Curve {
	case elliptic.P256():
		curve = tpm2.TPMECCNistP256
	case elliptic.P384():
		curve = tpm2.TPMECCNistP384
	default:
		return nil, fmt.Errorf("tpm: import: %w: ECDSA curve %s (want P-256 or P-384)", signer.ErrUnsupportedAlgorithm, priv.Curve.Params().Name)
	}
	if err := checkFree(u); err != nil {
		return nil, err
	}
	r := b.Rand
	if r == nil {
		r = rand.Reader
	}
	var blob *tpmpolicy.KeyBlob
	err = b.withConn(ctx, u, b.reclaiming(u, func(t transport.TPM) error {
		digest, policy, parent, err := prepareKey(t, u, curve)
		if err != nil {
			return err
		}
		defer flush(t, parent.handle)
		pub, sens, err := importAreas(r, priv, curve, policy)
		if err != nil {
			return err
		}
		name, err := tpm2.ObjectName(&pub)
		if err != nil {
			return err
		}
		encap, err := tpm2.ImportEncapsulationKey(&parent.public)
		if err != nil {
			return (fmt.Errorf("SRK public key: %w", err))
		}
		dup, seed, err := tpm2.CreateDuplicate(r, encap, name.Buffer, tpm2.Marshal(sens))
		if err != nil {
			return (fmt.Errorf("wrap key to the SRK: %w", err))
		}
		rsp, err := tpm2.Import{
			ParentHandle: parent.auth(),
			ObjectPublic: tpm2.New2B(pub),
			Duplicate:    tpm2.TPM2BPrivate{Buffer: dup},
			InSymSeed:    tpm2.TPM2BEncryptedSecret{Buffer: seed},
			Symmetric:    tpm2.TPMTSymDef{Algorithm: tpm2.TPMAlgNull},
		}.Execute(t)
		if err != nil {
			return fmt.Errorf("import key (TPM2_Import): %w", err)
		}
		blob = &tpmpolicy.KeyBlob{Public: tpm2.New2B(pub), Private: rsp.OutPrivate, PCRs: u.PCRs, PCRDigest: digest, Authorities: u.Authorities, Binding: u.binding()}
		return b.persist(t, u, parent, blob)
	}))
	if err != nil {
		return nil, fmt.Errorf("tpm: import key: %w", err)
	}
	s, err := b.finish(ctx, u, blob, "imported")
	if err != nil {
		return nil, err
	}
	if err := verifyBySigning(s, &priv.PublicKey); err != nil {
		return nil, errors.Join(fmt.Errorf("tpm: import key: %w", err), s.Close())
	}
	return s, nil
}

// importAreas builds the public and sensitive areas of an imported key.
func importAreas(r io.Reader, priv *ecdsa.PrivateKey, curve tpm2.TPMECCCurve, policy []byte) (tpm2.TPMTPublic, tpm2.TPMTSensitive, error) {
	size := (priv.Curve.Params().BitSize + 7) / 8
	ecdhKey, err := priv.ECDH()
	if err != nil {
		return tpm2.TPMTPublic{}, tpm2.TPMTSensitive{}, fmt.Errorf("private key: %w", err)
	}
	point := ecdhKey.PublicKey().Bytes() // 0x04 || X || Y
	d := ecdhKey.Bytes()
	pub := tpmpolicy.KeyTemplate(curve, policy, true)
	pub.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
		X: tpm2.TPM2BECCParameter{Buffer: point[1 : 1+size]},
		Y: tpm2.TPM2BECCParameter{Buffer: point[1+size:]},
	})
	// seedValue is the obfuscation value of an asymmetric key, of the
	// nameAlg's size (TPM 2.0 Part 2 §12.3.2.4).
	obf := make([]byte, sha256.Size)
	if _, err := io.ReadFull(r, obf); err != nil {
		return tpm2.TPMTPublic{}, tpm2.TPMTSensitive{}, fmt.Errorf("random: %w", err)
	}
	sens := tpm2.TPMTSensitive{
		SensitiveType: tpm2.TPMAlgECC,
		SeedValue:     tpm2.TPM2BDigest{Buffer: obf},
		Sensitive:     tpm2.NewTPMUSensitiveComposite(tpm2.TPMAlgECC, &tpm2.TPM2BECCParameter{Buffer: d}),
	}
	return pub, sens, nil
}

// checkFree refuses to create a key where a blob file exists. The write
// itself is no-clobber as well; this only fails early, before the TPM
// does any work.
func checkFree(u KeyURI) error {
	if u.Path == "" {
		return nil
	}
	if _, err := os.Lstat(u.Path); err == nil {
		return fmt.Errorf("tpm: %s: %w", u.Path, signer.ErrKeyExists)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("tpm: %s: %w", u.Path, err)
	}
	return nil
}

func checkCurveAndHandle(t transport.TPM, u KeyURI, curve tpm2.TPMECCCurve) error {
	ok, err := curveSupported(t, curve)
	if err != nil {
		return err
	}
	if !ok {
		return (fmt.Errorf("%w: this TPM does not implement ECC curve %v; use p256", signer.ErrUnsupportedAlgorithm, curve))
	}
	if u.Handle != 0 {
		used, err := handleInUse(t, u.Handle)
		if err != nil {
			return err
		}
		if used {
			return (fmt.Errorf("persistent handle 0x%08x: %w", uint32(u.Handle), signer.ErrKeyExists))
		}
	}
	return nil
}

// persist stores a new key: as a blob file, or loaded and made persistent
// with TPM2_EvictControl (owner authorization, empty owner password).
func (b *Backend) persist(t transport.TPM, u KeyURI, parent *srk, blob *tpmpolicy.KeyBlob) error {
	if u.Path != "" {
		data, err := blob.MarshalPEM("steward-trustd OS CA")
		if err != nil {
			return err
		}
		if err := atomicfile.Write(u.Path, data, 0o600, false); err != nil {
			if errors.Is(err, atomicfile.ErrExists) {
				return (fmt.Errorf("write key blob %s: %w", u.Path, signer.ErrKeyExists))
			}
			return (fmt.Errorf("write key blob: %w", err))
		}
		return nil
	}
	rsp, err := tpm2.Load{ParentHandle: parent.auth(), InPrivate: blob.Private, InPublic: blob.Public}.Execute(t)
	if err != nil {
		return fmt.Errorf("load new key (TPM2_Load): %w", err)
	}
	defer flush(t, rsp.ObjectHandle)
	_, err = tpm2.EvictControl{
		Auth:             tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
		ObjectHandle:     tpm2.NamedHandle{Handle: rsp.ObjectHandle, Name: rsp.Name},
		PersistentHandle: u.Handle,
	}.Execute(t)
	if err != nil {
		return fmt.Errorf("make key persistent at 0x%08x (TPM2_EvictControl, empty owner password): %w", uint32(u.Handle), err)
	}
	return nil
}

// finish opens the signer for a key just created.
func (b *Backend) finish(ctx context.Context, u KeyURI, blob *tpmpolicy.KeyBlob, how string) (*Signer, error) {
	k := &keyMaterial{pcrs: u.PCRs, pcrDigest: blob.PCRDigest, authorities: blob.Authorities, binding: blob.Binding}
	if u.Path != "" {
		k.blob = blob
	}
	if err := b.attachApprovals(u, k); err != nil {
		return nil, err
	}
	s, err := b.newSigner(ctx, u, k)
	if err != nil {
		return nil, err
	}
	b.logger().Info("tpm key "+how, "location", s.desc.Location, "fingerprint", s.desc.Fingerprint, "policy", s.desc.Policy)
	return s, nil
}

// verifyBySigning signs a fresh digest with s and checks it against want.
func verifyBySigning(s *Signer, want *ecdsa.PublicKey) error {
	if !want.Equal(s.Public()) {
		return errors.New("the TPM's public key differs from the imported key's")
	}
	digest := sha256.Sum256([]byte("steward-trustd tpm import check"))
	sig, err := s.Sign(nil, digest[:], crypto.SHA256)
	if err != nil {
		return fmt.Errorf("test signature: %w", err)
	}
	if !ecdsa.VerifyASN1(want, digest[:], sig) {
		return errors.New("test signature does not verify with the imported public key")
	}
	return nil
}
