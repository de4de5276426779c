//go:build cgo

package pkcs11

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	p11 "github.com/miekg/pkcs11"

	"github.com/steward-trustd/steward-trustd/signer"
)

// module is one loaded PKCS#11 library. C_Initialize and C_Finalize act on
// the library's process-wide state, not on a handle (PKCS#11 v2.40 §5.4):
// every Signer of a Backend that uses the same module-path shares one
// module value, and the module is re-initialised only when the library
// reports CKR_CRYPTOKI_NOT_INITIALIZED (someone called C_Finalize) or when
// no Signer on it is healthy and a token has to be searched for again
// (SoftHSM, like some HSM modules, only rescans its tokens at
// C_Initialize).
type module struct {
	path string

	mu      sync.Mutex
	ctx     *p11.Ctx
	gen     uint64 // bumped at every (re)initialisation through this value
	owned   bool   // this value's C_Initialize succeeded: finalize on release
	refs    int    // open Signers and in-progress Open/Generate/Import calls
	healthy int    // Signers currently able to sign
}

// modules is the Backend's set of loaded modules, by path.
type modules struct {
	mu sync.Mutex
	m  map[string]*module
}

// acquire loads and initialises the module at path, or shares the one
// already loaded.
func (ms *modules) acquire(path string) (*module, error) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if m, ok := ms.m[path]; ok {
		m.mu.Lock()
		m.refs++
		m.mu.Unlock()
		return m, nil
	}
	ctx := p11.New(path)
	if ctx == nil {
		// miekg/pkcs11 reports neither the dlopen error nor whether the
		// file exists; say what the usual causes are.
		return nil, fmt.Errorf("pkcs11: cannot load module %s (missing file, wrong architecture, or not a PKCS#11 library; SoftHSM on Debian is /usr/lib/softhsm/libsofthsm2.so)", path)
	}
	m := &module{path: path, ctx: ctx, refs: 1}
	if err := m.ctx.Initialize(); err != nil {
		if !errors.Is(err, p11.Error(p11.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
			ctx.Destroy()
			return nil, wrap("C_Initialize "+path, err)
		}
		// Another user in this process (e.g. a second Backend) initialised
		// the library: share it, and leave finalizing to that user.
	} else {
		m.owned = true
	}
	m.gen = 1
	if ms.m == nil {
		ms.m = make(map[string]*module)
	}
	ms.m[path] = m
	return m, nil
}

// release drops one reference; the last one finalizes (if this value
// initialised the library) and unloads it.
func (ms *modules) release(m *module) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refs--
	if m.refs > 0 {
		return
	}
	if m.owned {
		_ = m.ctx.Finalize() // nothing useful to do with a failure at unload
	}
	m.ctx.Destroy()
	delete(ms.m, m.path)
}

// generation returns the current initialisation generation. Session and
// object handles from an older generation are meaningless and must not be
// passed to the library: after C_Initialize they may name someone else's
// new session.
func (m *module) generation() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gen
}

// setHealthy counts Signers that can sign, so that a Signer looking for
// its lost token does not finalize the library under healthy ones.
func (m *module) setHealthy(delta int) {
	m.mu.Lock()
	m.healthy += delta
	m.mu.Unlock()
}

// reinit re-initialises the library if it is still at generation seen.
// If the library is not initialised (someone called C_Finalize) it only
// calls C_Initialize. If it is initialised, it calls C_Finalize first,
// but only when no Signer on this module is healthy and force is set.
func (m *module) reinit(seen uint64, force bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gen != seen {
		return nil // someone else already did it
	}
	_, err := m.ctx.GetInfo()
	switch {
	case errors.Is(err, p11.Error(p11.CKR_CRYPTOKI_NOT_INITIALIZED)):
	case err != nil:
		return wrap("C_GetInfo", err)
	case !force || m.healthy > 0:
		return nil
	default:
		if err := m.ctx.Finalize(); err != nil && !errors.Is(err, p11.Error(p11.CKR_CRYPTOKI_NOT_INITIALIZED)) {
			return wrap("C_Finalize", err)
		}
	}
	if err := m.ctx.Initialize(); err != nil {
		if !errors.Is(err, p11.Error(p11.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
			return wrap("C_Initialize "+m.path, err)
		}
	} else {
		m.owned = true
	}
	m.gen++
	return nil
}

// findSlot returns the one slot whose token and slot match u. No match is
// ErrDeviceUnavailable (the token may be unplugged); several matches are
// an error asking for a narrower URI.
func (m *module) findSlot(u *URI) (uint, p11.TokenInfo, error) {
	ctx := m.ctx
	if u.LibraryManufacturer != "" || u.LibraryDescription != "" || u.LibraryVersion != "" {
		info, err := ctx.GetInfo()
		if err != nil {
			return 0, p11.TokenInfo{}, wrap("C_GetInfo", err)
		}
		if miss := libraryMismatches(u, info); len(miss) > 0 {
			return 0, p11.TokenInfo{}, fmt.Errorf("pkcs11: module %s does not match the URI's library attributes (%s); fix or drop them: %w", m.path, strings.Join(miss, ", "), signer.ErrDeviceUnavailable)
		}
	}
	slots, err := ctx.GetSlotList(true)
	if err != nil {
		return 0, p11.TokenInfo{}, wrap("C_GetSlotList", err)
	}
	var found []uint
	var foundInfo p11.TokenInfo
	var misses []string
	for _, id := range slots {
		ti, miss := m.slotMismatches(u, id)
		if len(miss) > 0 {
			misses = append(misses, fmt.Sprintf("slot %d: %s", id, strings.Join(miss, ", ")))
			continue
		}
		found = append(found, id)
		foundInfo = ti
	}
	switch len(found) {
	case 0:
		return 0, p11.TokenInfo{}, noTokenError(u, m.path, misses)
	case 1:
		return found[0], foundInfo, nil
	}
	return 0, p11.TokenInfo{}, fmt.Errorf("pkcs11: %d tokens match %s in module %s; add serial= to the URI", len(found), tokenSelector(u), m.path)
}

func tokenSelector(u *URI) string {
	var parts []string
	if u.Token != "" {
		parts = append(parts, "token="+escape(u.Token, isPathChar))
	}
	if u.Serial != "" {
		parts = append(parts, "serial="+escape(u.Serial, isPathChar))
	}
	if u.SlotID != nil {
		parts = append(parts, fmt.Sprintf("slot-id=%d", *u.SlotID))
	}
	return strings.Join(parts, ";")
}

// slotMismatches returns slot id's token info and every reason it does
// not match u, one "attribute: URI says ..., token has ..." per attribute;
// none means it matches.
func (m *module) slotMismatches(u *URI, id uint) (p11.TokenInfo, []string) {
	if u.SlotID != nil && *u.SlotID != id {
		return p11.TokenInfo{}, []string{fmt.Sprintf("slot-id: URI says %d", *u.SlotID)}
	}
	ti, err := m.ctx.GetTokenInfo(id)
	if err != nil {
		// A token that went away while we looked.
		return ti, []string{"C_GetTokenInfo: " + err.Error()}
	}
	if ti.Flags&p11.CKF_TOKEN_INITIALIZED == 0 {
		return ti, []string{"token not initialised"}
	}
	miss := tokenMismatches(u, ti)
	if u.SlotDescription != "" || u.SlotManufacturer != "" {
		si, err := m.ctx.GetSlotInfo(id)
		if err != nil {
			return ti, append(miss, "C_GetSlotInfo: "+err.Error())
		}
		miss = append(miss, mismatches([]attrCheck{
			{"slot-description", u.SlotDescription, si.SlotDescription},
			{"slot-manufacturer", u.SlotManufacturer, si.ManufacturerID},
		})...)
	}
	return ti, miss
}

// maxReportedSlots bounds the slots a no-match error describes.
const maxReportedSlots = 8

// noTokenError says that no token matched, and why for each slot, so that
// the operator sees which attribute to fix. Token attribute values are
// not secret (the PIN is a query attribute and is never compared).
func noTokenError(u *URI, path string, misses []string) error {
	why := "the module reports no slot with a token"
	if len(misses) > 0 {
		if len(misses) > maxReportedSlots {
			misses = append(misses[:maxReportedSlots], fmt.Sprintf("and %d more slots", len(misses)-maxReportedSlots))
		}
		why = strings.Join(misses, "; ")
	}
	return fmt.Errorf("pkcs11: no initialised token matches %s in module %s (%s); fix the URI's attributes (p11tool --provider %s --list-tokens shows each token's URI): %w",
		tokenSelector(u), path, why, path, signer.ErrDeviceUnavailable)
}

func tokenMismatches(u *URI, ti p11.TokenInfo) []string {
	return mismatches([]attrCheck{
		{"token", u.Token, ti.Label},
		{"manufacturer", u.Manufacturer, ti.ManufacturerID},
		{"model", u.Model, ti.Model},
		{"serial", u.Serial, ti.SerialNumber},
	})
}

// libraryMismatches is tokenMismatches for the library attributes
// (C_GetInfo).
func libraryMismatches(u *URI, info p11.Info) []string {
	miss := mismatches([]attrCheck{
		{"library-manufacturer", u.LibraryManufacturer, info.ManufacturerID},
		{"library-description", u.LibraryDescription, info.LibraryDescription},
	})
	if u.LibraryVersion == "" {
		return miss
	}
	// RFC 7512 §2.3: "library-version=2" matches any 2.x.
	maj, minor, hasMinor := strings.Cut(u.LibraryVersion, ".")
	if maj != fmt.Sprint(info.LibraryVersion.Major) ||
		hasMinor && strings.TrimLeft(minor, "0") != strings.TrimLeft(fmt.Sprint(info.LibraryVersion.Minor), "0") {
		miss = append(miss, fmt.Sprintf("library-version: URI says %s, module has %d.%d", u.LibraryVersion, info.LibraryVersion.Major, info.LibraryVersion.Minor))
	}
	return miss
}
