package relay

// Client isolation, as the kernel's resource manager (/dev/tpmrm0) and
// tpm2-abrmd give it: a client sees, uses and flushes only the transient
// objects and sessions it created (objects it no longer finds loaded are
// swapped back in, swap.go); a command naming another client's handle is
// answered by the relay with
// TPM_RC_HANDLE (TPM 2.0 Part 2 §6.6.3) without reaching the TPM, and a
// listing of loaded handles (TPM2_GetCapability(TPM_CAP_HANDLES)) shows
// only the client's own. Persistent objects, NV indices and PCRs are
// shared, as on a resource manager.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/google/go-tpm/tpm2"
)

// Response codes the relay answers with (Part 2 §6.6.3: format-one
// TPM_RC_HANDLE; bits 8–11 number the handle, with TPM_RC_P a
// parameter, with TPM_RC_S a session).
const (
	rcHandle  = 0x08B
	rcP       = 0x040
	rcS       = 0x800
	rcNumber1 = 0x100
)

// handle types (Part 2 §7.2) of the handles a client owns.
const (
	htHMACSession   = 0x02
	htPolicySession = 0x03
	htTransient     = 0x80
)

// ownable reports whether h is of a kind a client owns (transient object
// or session) rather than shares.
func ownable(h uint32) bool {
	switch h >> 24 {
	case htHMACSession, htPolicySession, htTransient:
		return true
	}
	return false
}

// handleCounts maps a command code to the number of handles in its
// handle area, as the TPM reports it (TPMA_CC.cHandles, Part 2 §8.9,
// from TPM2_GetCapability(TPM_CAP_COMMANDS)), the way the kernel learns
// it.
type handleCounts map[tpm2.TPMCC]int

// commandsQuery is TPM2_GetCapability(TPM_CAP_COMMANDS, first, 256).
func commandsQuery(first uint32) []byte { return capabilityQuery(tpm2.TPMCapCommands, first, 256) }

// capabilityQuery is TPM2_GetCapability(capability, property, count)
// without sessions (Part 3 §30.2).
func capabilityQuery(capability tpm2.TPMCap, property, count uint32) []byte {
	b := make([]byte, 22)
	binary.BigEndian.PutUint16(b[0:2], uint16(tpm2.TPMSTNoSessions))
	binary.BigEndian.PutUint32(b[2:6], 22)
	binary.BigEndian.PutUint32(b[6:10], uint32(tpm2.TPMCCGetCapability))
	binary.BigEndian.PutUint32(b[10:14], uint32(capability))
	binary.BigEndian.PutUint32(b[14:18], property)
	binary.BigEndian.PutUint32(b[18:22], count)
	return b
}

// LoadedHandles lists every transient object and session loaded in the
// TPM, whoever owns it (the view a client no longer has), for tests and
// diagnostics.
func (r *Relay) LoadedHandles() ([]tpm2.TPMHandle, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []tpm2.TPMHandle
	for _, first := range []uint32{htTransient << 24, htHMACSession << 24, htPolicySession << 24} {
		hs, err := r.loadedLocked(first)
		if err != nil {
			return nil, err
		}
		out = append(out, hs...)
	}
	return out, nil
}

// loadedLocked lists the TPM's handles of first's type (at most 16
// pages of 64).
func (r *Relay) loadedLocked(first uint32) ([]tpm2.TPMHandle, error) {
	var out []tpm2.TPMHandle
	for range 16 {
		rsp, err := r.roundTripLocked(capabilityQuery(tpm2.TPMCapHandles, first, 64))
		if err != nil {
			return nil, err
		}
		if ResponseCode(rsp) != 0 || len(rsp) < 19 {
			return nil, fmt.Errorf("TPM2_GetCapability(TPM_CAP_HANDLES): response code 0x%x", ResponseCode(rsp))
		}
		n := min(binary.BigEndian.Uint32(rsp[15:19]), uint32(len(rsp)-19)/4)
		for i := range n {
			if h := binary.BigEndian.Uint32(rsp[19+4*i:]); h>>24 == first>>24 {
				out = append(out, tpm2.TPMHandle(h))
				first = h + 1
			}
		}
		if rsp[10] == 0 || n == 0 {
			break
		}
	}
	return out, nil
}

// parseCommands adds the TPMA_CCs of a TPM_CAP_COMMANDS response to hc
// and returns the next command index to ask for, or 0 when done.
func (hc handleCounts) parseCommands(rsp []byte) (uint32, error) {
	if ResponseCode(rsp) != 0 || len(rsp) < 19 {
		return 0, fmt.Errorf("TPM2_GetCapability(TPM_CAP_COMMANDS): response code 0x%x, %d bytes", ResponseCode(rsp), len(rsp))
	}
	more, n := rsp[10] != 0, binary.BigEndian.Uint32(rsp[15:19])
	if uint64(len(rsp)) < 19+4*uint64(n) {
		return 0, errors.New("TPM2_GetCapability(TPM_CAP_COMMANDS): truncated response")
	}
	var last uint32
	for i := range n {
		a := binary.BigEndian.Uint32(rsp[19+4*i:])
		cc := a & 0xffff
		if a&(1<<29) != 0 { // V: a vendor command
			cc |= 1 << 29
		}
		hc[tpm2.TPMCC(cc)] = int(a>>25) & 7
		last = a & 0xffff
	}
	if !more || n == 0 {
		return 0, nil
	}
	return last + 1, nil
}

// refusal is the relay's answer to a command it will not forward: a
// 10-byte response with the code rc.
func refusal(rc uint32) []byte {
	b := make([]byte, 10)
	binary.BigEndian.PutUint16(b[0:2], uint16(tpm2.TPMSTNoSessions))
	binary.BigEndian.PutUint32(b[2:6], 10)
	binary.BigEndian.PutUint32(b[6:10], rc)
	return b
}

// foreign returns the response code refusing cmd when it names an
// ownable handle cl does not own (in the handle area, the session area,
// or FlushContext's parameter), or 0. nHandles is the command's handle
// count; -1 when unknown (then only FlushContext is checked).
func (cl *client) foreign(cmd []byte, nHandles int) uint32 {
	cc := CommandCode(cmd)
	if cc == tpm2.TPMCCFlushContext && len(cmd) >= 14 {
		if h := binary.BigEndian.Uint32(cmd[10:14]); ownable(h) && !cl.owns(h) {
			return rcHandle | rcP | rcNumber1
		}
		return 0
	}
	if nHandles < 0 || len(cmd) < 10+4*nHandles {
		return 0
	}
	for i := range nHandles {
		if h := binary.BigEndian.Uint32(cmd[10+4*i:]); ownable(h) && !cl.owns(h) {
			return rcHandle | uint32(i+1)<<8
		}
	}
	for i, s := range sessionsOf(cmd, nHandles) {
		if ownable(s.handle) && !cl.owns(s.handle) {
			return rcHandle | rcS | uint32(min(i+1, 7))<<8
		}
	}
	return 0
}

func (cl *client) owns(h uint32) bool {
	_, ok := cl.objects[tpm2.TPMHandle(h)]
	return ok
}

// session is one entry of a command's authorization area.
type session struct {
	handle uint32
	// ends: continueSession is clear, so a successful command ends it.
	ends bool
}

// sessionsOf parses the authorization area of a TPM_ST_SESSIONS command
// (Part 1 §18.7: after the handles, authorizationSize, then per session
// handle, nonce, attributes, hmac). A malformed area yields what parsed.
func sessionsOf(cmd []byte, nHandles int) []session {
	off := 10 + 4*nHandles
	if nHandles < 0 || len(cmd) < off+4 || binary.BigEndian.Uint16(cmd[0:2]) != uint16(tpm2.TPMSTSessions) {
		return nil
	}
	end := off + 4 + int(binary.BigEndian.Uint32(cmd[off:]))
	if end > len(cmd) {
		return nil
	}
	var out []session
	for p := off + 4; p+4 <= end && len(out) < 3; {
		h := binary.BigEndian.Uint32(cmd[p:])
		p += 4
		if p+2 > end {
			break
		}
		p += 2 + int(binary.BigEndian.Uint16(cmd[p:]))
		if p+1 > end {
			break
		}
		attrs := cmd[p]
		p++
		if p+2 > end {
			break
		}
		p += 2 + int(binary.BigEndian.Uint16(cmd[p:]))
		if p > end {
			break
		}
		out = append(out, session{handle: h, ends: attrs&1 == 0})
	}
	return out
}

// handlesQuery decodes TPM2_GetCapability(TPM_CAP_HANDLES, property,
// count) for ownable handles, the listing the relay filters.
func handlesQuery(cmd []byte) (property, count uint32, ok bool) {
	if CommandCode(cmd) != tpm2.TPMCCGetCapability || len(cmd) != 22 || binary.BigEndian.Uint16(cmd[0:2]) != uint16(tpm2.TPMSTNoSessions) {
		return 0, 0, false
	}
	if tpm2.TPMCap(binary.BigEndian.Uint32(cmd[10:14])) != tpm2.TPMCapHandles {
		return 0, 0, false
	}
	property, count = binary.BigEndian.Uint32(cmd[14:18]), binary.BigEndian.Uint32(cmd[18:22])
	return property, count, ownable(property)
}

// ownHandles answers a TPM_CAP_HANDLES listing of an ownable range from
// the client's own handles: those of the range's type at or above
// property, ascending, at most count, with moreData when more remain
// (Part 3 §30.2).
func (cl *client) ownHandles(property, count uint32) []byte {
	var hs []uint32
	for h := range cl.objects {
		if v := uint32(h); v>>24 == property>>24 && v >= property {
			hs = append(hs, v)
		}
	}
	slices.Sort(hs)
	more := byte(0)
	if uint32(len(hs)) > count {
		hs, more = hs[:count], 1
	}
	b := make([]byte, 10, 19+4*len(hs))
	b = append(b, more)
	b = binary.BigEndian.AppendUint32(b, uint32(tpm2.TPMCapHandles))
	b = binary.BigEndian.AppendUint32(b, uint32(len(hs)))
	for _, h := range hs {
		b = binary.BigEndian.AppendUint32(b, h)
	}
	binary.BigEndian.PutUint16(b[0:2], uint16(tpm2.TPMSTNoSessions))
	binary.BigEndian.PutUint32(b[2:6], uint32(len(b)))
	return b
}
