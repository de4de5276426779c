package tpm

import (
	"crypto"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// Scheme is the key URI scheme of this backend.
const Scheme = "tpm"

// Owner persistent handle range (TPM 2.0 Part 2 §7.5 and the TCG
// "Registry of Reserved TPM 2.0 Handles": 0x81000000–0x817FFFFF is the
// owner's; the rest of 0x81 belongs to the platform).
const (
	PersistentMin tpm2.TPMHandle = 0x81000000
	PersistentMax tpm2.TPMHandle = 0x817FFFFF
)

// DefaultPCR is the PCR selection used when a key URI names none: PCR 7
// holds the Secure Boot policy state, which is what a CA key should be
// bound to on a Talos node.
const DefaultPCR = 7

// Timeout bounds.
const (
	DefaultTimeout = 10 * time.Second
	minTimeout     = 100 * time.Millisecond
	maxTimeout     = 10 * time.Minute
)

// DeviceKind says how to reach a TPM.
type DeviceKind int

// Device kinds.
const (
	// DeviceAuto means no device was named: /dev/tpmrm0, else /dev/tpm0.
	DeviceAuto DeviceKind = iota
	// DeviceChar is a TPM character device (device=/dev/tpmrm0).
	DeviceChar
	// DeviceTCP is a swtpm (or other raw TPM command) TCP socket (swtpm=host:port).
	DeviceTCP
	// DeviceUnix is a swtpm unix socket (socket=/path).
	DeviceUnix
)

// Device names the TPM a key lives in. Addr is the device path, host:port
// or socket path; it is empty for DeviceAuto.
type Device struct {
	Kind DeviceKind
	Addr string
}

// String renders the device as its key URI attribute, or "auto".
func (d Device) String() string {
	switch d.Kind {
	case DeviceChar:
		return "device=" + d.Addr
	case DeviceTCP:
		return "swtpm=" + d.Addr
	case DeviceUnix:
		return "socket=" + d.Addr
	}
	return "device=auto"
}

// singleClient reports whether the device serves one client at a time
// without a resource manager (a swtpm socket, /dev/tpm0), so that handles
// found there belong to clients that are gone.
func (d Device) singleClient() bool {
	switch d.Kind {
	case DeviceTCP, DeviceUnix:
		return true
	case DeviceChar:
		return !isResourceManager(d.Addr)
	}
	return false
}

// KeyURI is a parsed tpm: key URI.
type KeyURI struct {
	// Path is the key blob file; empty when Handle is set.
	Path string
	// Handle is the persistent handle; zero when Path is set.
	Handle tpm2.TPMHandle
	// Device is the TPM to use.
	Device Device
	// PCRs is the sha256 PCR selection, sorted; PCRsSet says whether the
	// URI named it (otherwise it is [DefaultPCR]).
	PCRs    []int
	PCRsSet bool
	// Timeout bounds each TPM operation (DefaultTimeout if not named).
	Timeout time.Duration
	// Approvals is the approvals directory of a key under policy
	// authorities (approvals=DIR); empty for a PCR-bound key.
	Approvals string
	// Authorities are the policy authorities a new key is created under
	// (authority=, set by the ceremony with WithAuthorities). For Open of
	// a blob the authorities come from the blob, and these must equal them.
	Authorities []*tpmpolicy.Authority
	// Systemd (systemd=true) makes a new key under policy authorities
	// systemd-compatible: empty policyRef, PCR 11 (SystemdBinding), so
	// that systemd-measure's approvals satisfy it. For Open of a blob the
	// blob says; a given systemd=true must agree.
	Systemd bool
	// Revocation (revocation=0x01xxxxxx) makes a new key under policy
	// authorities revocable: its approvals carry an epoch checked by the
	// TPM against the NV counter at this index (tpmpolicy.RevocableBinding;
	// the ceremony's --revocable). For Open of a blob the blob says; a
	// given revocation= must agree.
	Revocation tpm2.TPMHandle
	// Connections is how many connections to the TPM the signer keeps
	// (connections=, 1 or 2; defaultConnections if not named), each with
	// the key loaded and a policy session of its own.
	Connections int
	// legacy makes a new key under policy authorities a v1 key (tpmpolicy.PolicyRef,
	// selection not bound). Only the tests of v1 compatibility set it:
	// no URI can.
	legacy bool
}

// binding is the binding of a key the URI creates (or of a handle= key,
// which records none): systemd, or v2 over the URI's PCRs.
func (u KeyURI) binding() tpmpolicy.Binding {
	switch {
	case u.Systemd:
		return tpmpolicy.SystemdBinding()
	case u.legacy:
		return tpmpolicy.LegacyBinding()
	case u.Revocation != 0:
		return revocableBinding(u)
	}
	b, err := tpmpolicy.BindingForPCRs(u.PCRs)
	if err != nil {
		return tpmpolicy.Binding{} // unreachable: ParseURI checked the PCRs with the same rule
	}
	return b
}

// String renders the URI in canonical attribute order. It holds no secret.
func (u KeyURI) String() string {
	var parts []string
	if u.Path != "" {
		parts = append(parts, "path="+u.Path)
	} else {
		parts = append(parts, fmt.Sprintf("handle=0x%08x", uint32(u.Handle)))
	}
	if u.Device.Kind != DeviceAuto {
		parts = append(parts, u.Device.String())
	}
	if u.PCRsSet {
		parts = append(parts, "pcrs="+tpmpolicy.PCRList(u.PCRs))
	}
	if u.Timeout != DefaultTimeout {
		parts = append(parts, "timeout="+u.Timeout.String())
	}
	if u.Approvals != "" {
		parts = append(parts, "approvals="+u.Approvals)
	}
	if u.Systemd {
		parts = append(parts, "systemd=true")
	}
	if u.Revocation != 0 {
		parts = append(parts, fmt.Sprintf("revocation=0x%08x", uint32(u.Revocation)))
	}
	if u.Connections != defaultConnections(u.Device) {
		parts = append(parts, "connections="+strconv.Itoa(u.Connections))
	}
	return Scheme + ":" + strings.Join(parts, ";")
}

func uriErr(format string, args ...any) error {
	return fmt.Errorf("%w: tpm: "+format, append([]any{signer.ErrInvalidURI}, args...)...)
}

// ParseURI parses a tpm: key URI strictly: see the package documentation
// for the grammar. Every error wraps signer.ErrInvalidURI.
func ParseURI(uri string) (KeyURI, error) {
	rest, ok := strings.CutPrefix(uri, Scheme+":")
	if !ok {
		return KeyURI{}, uriErr("URI must start with %q", Scheme+":")
	}
	if rest == "" {
		return KeyURI{}, uriErr("URI names no key (want path=/file.tpmkey or handle=0x81000100)")
	}
	p := uriParser{u: KeyURI{Timeout: DefaultTimeout, PCRs: []int{DefaultPCR}}, seen: map[string]bool{}}
	for _, attr := range strings.Split(rest, ";") {
		if err := p.attribute(attr); err != nil {
			return KeyURI{}, err
		}
	}
	switch {
	case p.u.Path != "" && p.u.Handle != 0:
		return KeyURI{}, uriErr("give path= or handle=, not both")
	case p.u.Path == "" && p.u.Handle == 0:
		return KeyURI{}, uriErr("URI names no key (want path=/file.tpmkey or handle=0x81000100)")
	case len(p.u.Authorities) > 0 && p.u.Approvals == "":
		return KeyURI{}, uriErr("a key under a policy authority needs its approvals directory (approvals=/dir)")
	}
	if err := p.systemd(); err != nil {
		return KeyURI{}, err
	}
	if err := p.revocation(); err != nil {
		return KeyURI{}, err
	}
	if err := p.connections(); err != nil {
		return KeyURI{}, err
	}
	return p.u, nil
}

// uriParser is the state of one ParseURI.
type uriParser struct {
	u          KeyURI
	seen       map[string]bool
	deviceAttr string // the attribute that named the TPM, if any
	conns      string // connections=, checked against the device at the end
}

// connections sets the connection count: connections= if given (checked
// against the device, whichever attribute came first), else the device's
// default.
func (p *uriParser) connections() error {
	if p.conns == "" {
		p.u.Connections = defaultConnections(p.u.Device)
		return nil
	}
	n, err := parseConnections(p.conns, p.u.Device)
	p.u.Connections = n
	return err
}

// systemd checks systemd=true: the key is under a policy authority
// (approvals=) and bound to PCR 11, the one systemd-measure signs for.
func (p *uriParser) systemd() error {
	switch {
	case !p.u.Systemd:
		return nil
	case p.u.Approvals == "":
		return uriErr("systemd=true applies to a key under a policy authority; name its approvals directory (approvals=/dir)")
	case p.u.PCRsSet && !slices.Equal(p.u.PCRs, []int{tpmpolicy.SystemdPCR}):
		return uriErr("systemd=true binds PCR %d, the one systemd-measure signs for, not pcrs=%s", tpmpolicy.SystemdPCR, tpmpolicy.PCRList(p.u.PCRs))
	}
	p.u.PCRs = []int{tpmpolicy.SystemdPCR}
	return nil
}

// attribute checks the syntax of one key=value attribute and applies it.
func (p *uriParser) attribute(attr string) error {
	k, v, ok := strings.Cut(attr, "=")
	switch {
	case !ok:
		return uriErr("attribute %q is not key=value", attr)
	case v == "":
		return uriErr("attribute %q has an empty value", k)
	case p.seen[k]:
		return uriErr("attribute %q given twice", k)
	case strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return uriErr("attribute %q contains a control character", k)
	}
	p.seen[k] = true
	return p.apply(k, v)
}

// apply sets attribute k to v.
func (p *uriParser) apply(k, v string) error {
	var err error
	switch k {
	case "path":
		p.u.Path, err = absCleanPath(k, v)
	case "handle":
		p.u.Handle, err = parseHandle(v)
	case "device", "swtpm", "socket":
		if p.deviceAttr != "" {
			return uriErr("attributes %q and %q both name a TPM; give at most one", p.deviceAttr, k)
		}
		p.deviceAttr = k
		p.u.Device, err = parseDevice(k, v)
	case "pcrs":
		p.u.PCRs, err = tpmpolicy.ParsePCRs(v)
		p.u.PCRsSet = true
	case "timeout":
		p.u.Timeout, err = parseTimeout(v)
	case "approvals":
		p.u.Approvals, err = absCleanPath(k, v)
	case "authority":
		p.u.Authorities, err = parseAuthorities(v)
	case "systemd":
		if v != "true" {
			return uriErr("systemd=%q: the only value is true", v)
		}
		p.u.Systemd = true
	case "revocation":
		p.u.Revocation, err = parseRevocationIndex(v)
	case "connections":
		p.conns = v
	default:
		return uriErr("unknown attribute %q (known: path, handle, device, swtpm, socket, pcrs, timeout, approvals, authority, systemd, revocation, connections)", k)
	}
	return err
}

func parseTimeout(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, uriErr("timeout %q: %v", v, err)
	}
	if d < minTimeout || d > maxTimeout {
		return 0, uriErr("timeout %v out of range [%v, %v]", d, minTimeout, maxTimeout)
	}
	return d, nil
}

func absCleanPath(attr, p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", uriErr("%s %q is not an absolute path", attr, p)
	}
	if filepath.Clean(p) != p {
		return "", uriErr("%s %q is not clean (want %q)", attr, p, filepath.Clean(p))
	}
	return p, nil
}

func parseHandle(v string) (tpm2.TPMHandle, error) {
	hex, ok := strings.CutPrefix(v, "0x")
	if !ok || len(hex) != 8 {
		return 0, uriErr("handle %q must be 0x followed by 8 hex digits, e.g. 0x81000100", v)
	}
	n, err := strconv.ParseUint(hex, 16, 32)
	if err != nil {
		return 0, uriErr("handle %q must be 0x followed by 8 hex digits, e.g. 0x81000100", v)
	}
	h := tpm2.TPMHandle(n)
	if h < PersistentMin || h > PersistentMax {
		return 0, uriErr("handle %q is outside the owner persistent range 0x81000000-0x817fffff", v)
	}
	return h, nil
}

func parseDevice(k, v string) (Device, error) {
	switch k {
	case "device":
		p, err := absCleanPath(k, v)
		if err != nil {
			return Device{}, err
		}
		return Device{Kind: DeviceChar, Addr: p}, nil
	case "socket":
		p, err := absCleanPath(k, v)
		if err != nil {
			return Device{}, err
		}
		return Device{Kind: DeviceUnix, Addr: p}, nil
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil || host == "" {
		return Device{}, uriErr("swtpm %q must be host:port", v)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != port {
		return Device{}, uriErr("swtpm %q has an invalid port", v)
	}
	return Device{Kind: DeviceTCP, Addr: v}, nil
}

// IsKeyURI reports whether uri names a key of this backend (its scheme is
// tpm:), without checking the rest.
func IsKeyURI(uri string) bool { return strings.HasPrefix(uri, Scheme+":") }

// WithPCRs returns uri with the PCR selection pcrs (see tpmpolicy.ParsePCRs), so
// that a ceremony's --pcrs flag and the URI's pcrs= attribute cannot
// disagree: uri must be a valid tpm: key URI; if it already names pcrs=
// the selections must be equal (uri is returned unchanged), otherwise
// ";pcrs=..." is appended. An empty pcrs returns uri unchanged. Every
// error wraps signer.ErrInvalidURI.
func WithPCRs(uri string, pcrs []int) (string, error) {
	if len(pcrs) == 0 {
		return uri, nil
	}
	if !IsKeyURI(uri) {
		return "", uriErr("a PCR selection only applies to %s: key URIs, not %q", Scheme, scheme(uri))
	}
	u, err := ParseURI(uri)
	if err != nil {
		return "", err
	}
	want, err := tpmpolicy.ParsePCRs(tpmpolicy.PCRList(pcrs)) // the one rule: range, duplicates, order
	if err != nil {
		return "", err
	}
	if u.PCRsSet {
		if !slices.Equal(u.PCRs, want) {
			return "", uriErr("the key URI already selects PCRs %s, the PCR selection given is %s", tpmpolicy.PCRList(u.PCRs), tpmpolicy.PCRList(want))
		}
		return uri, nil
	}
	return uri + ";pcrs=" + tpmpolicy.PCRList(want), nil
}

// scheme is the scheme of a key URI, for messages (never the rest, which
// may hold a PIN).
func scheme(uri string) string {
	s, _, ok := strings.Cut(uri, ":")
	if !ok {
		return "(no scheme)"
	}
	return s + ":"
}

// parseAuthorities decodes authority=: a comma-separated list of base64url
// (unpadded) DER SubjectPublicKeyInfo, at most MaxAuthorities, distinct.
func parseAuthorities(v string) ([]*tpmpolicy.Authority, error) {
	var out []*tpmpolicy.Authority
	for _, f := range strings.Split(v, ",") {
		der, err := base64.RawURLEncoding.DecodeString(f)
		if err != nil {
			return nil, uriErr("authority: not base64url DER public key: %v", err)
		}
		pub, err := x509.ParsePKIXPublicKey(der)
		if err != nil {
			return nil, uriErr("authority: %v", err)
		}
		a, err := tpmpolicy.NewAuthority(pub)
		if err != nil {
			return nil, uriErr("authority: %v", err)
		}
		if slices.ContainsFunc(out, func(x *tpmpolicy.Authority) bool { return x.Fingerprint() == a.Fingerprint() }) {
			return nil, uriErr("authority %s given twice", a.Fingerprint())
		}
		out = append(out, a)
	}
	if len(out) > tpmpolicy.MaxAuthorities {
		return nil, uriErr("at most %d policy authorities (PolicyOR branches)", tpmpolicy.MaxAuthorities)
	}
	return out, nil
}

// WithAuthorities returns the tpm: key URI uri with the policy authorities
// pubs (authority=), so that Generate and Import create the key under
// PolicyAuthorize of each (PolicyOR of the branches for two or more).
// uri must name approvals=DIR and no authority yet. Every error wraps
// signer.ErrInvalidURI (or signer.ErrUnsupportedAlgorithm for a key that
// cannot be an authority).
func WithAuthorities(uri string, pubs []crypto.PublicKey) (string, error) {
	if len(pubs) == 0 {
		return uri, nil
	}
	if !IsKeyURI(uri) {
		return "", uriErr("a policy authority only applies to %s: key URIs, not %q", Scheme, scheme(uri))
	}
	parts := make([]string, len(pubs))
	for i, pub := range pubs {
		if _, err := tpmpolicy.NewAuthority(pub); err != nil {
			return "", err
		}
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			return "", uriErr("authority: %v", err)
		}
		parts[i] = base64.RawURLEncoding.EncodeToString(der)
	}
	out := uri + ";authority=" + strings.Join(parts, ",")
	if _, err := ParseURI(out); err != nil {
		return "", err
	}
	return out, nil
}
