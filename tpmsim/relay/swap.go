package relay

// Context swapping, as the kernel's resource manager does it: the TPM
// holds only a few transient objects (swtpm: 3), so when a client's
// command fails for want of object memory, the relay saves another
// client's loaded objects (TPM2_ContextSave, Part 3 §28.2) and flushes
// them, then retries; when their owner next names one, the relay loads
// it back (TPM2_ContextLoad, §28.3), possibly under another handle, and
// rewrites the owner's handles to the TPM's. A client always sees the
// handle numbers it was first given (its virtual handles). Handles are
// not part of any HMAC or cpHash (Part 1 §18.7), so rewriting them keeps
// authorizations valid.

import (
	"encoding/binary"
	"fmt"

	"github.com/google/go-tpm/tpm2"
)

// Response codes that make the relay swap another client's objects out
// (Part 2 §6.6.3: TPM_RC_OBJECT_MEMORY).
const rcObjectMemory = 0x902

// realHandle is the TPM's handle for a client's handle v.
func (cl *client) realHandle(v uint32) uint32 {
	if r, ok := cl.real[tpm2.TPMHandle(v)]; ok {
		return uint32(r)
	}
	return v
}

// toRealLocked returns cmd with the client's virtual object handles
// (handle area, and FlushContext's parameter) replaced by the TPM's,
// loading swapped-out objects back first.
func (r *Relay) toRealLocked(cl *client, cmd []byte, nh int) ([]byte, error) {
	offsets := handleOffsets(cmd, nh)
	if len(offsets) == 0 || r.opts.KeepObjects {
		return cmd, nil
	}
	out := append([]byte(nil), cmd...)
	for _, off := range offsets {
		v := binary.BigEndian.Uint32(cmd[off:])
		if v>>24 != htTransient || !cl.owns(v) {
			continue
		}
		if err := r.swapInLocked(cl, tpm2.TPMHandle(v)); err != nil {
			return nil, err
		}
		binary.BigEndian.PutUint32(out[off:], cl.realHandle(v))
	}
	return out, nil
}

// handleOffsets are the offsets of the handles of cmd: its handle area,
// or FlushContext's handle parameter.
func handleOffsets(cmd []byte, nh int) []int {
	if CommandCode(cmd) == tpm2.TPMCCFlushContext && len(cmd) >= 14 {
		return []int{10}
	}
	var out []int
	for i := 0; i < nh && len(cmd) >= 14+4*i; i++ {
		out = append(out, 10+4*i)
	}
	return out
}

// swapInLocked loads the client's object v back if it was swapped out,
// swapping out other clients' objects while the TPM is full.
func (r *Relay) swapInLocked(cl *client, v tpm2.TPMHandle) error {
	blob, ok := cl.saved[v]
	if !ok {
		return nil
	}
	load := append(make([]byte, 10, 10+len(blob)), blob...)
	binary.BigEndian.PutUint16(load[0:2], uint16(tpm2.TPMSTNoSessions))
	binary.BigEndian.PutUint32(load[2:6], uint32(len(load)))
	binary.BigEndian.PutUint32(load[6:10], uint32(tpm2.TPMCCContextLoad))
	rsp, err := r.roundTripEvictingLocked(cl, load)
	if err != nil {
		return err
	}
	if ResponseCode(rsp) != 0 || len(rsp) < 14 {
		return fmt.Errorf("load a swapped-out object back (TPM2_ContextLoad): response code 0x%x", ResponseCode(rsp))
	}
	delete(cl.saved, v)
	cl.setReal(v, tpm2.TPMHandle(binary.BigEndian.Uint32(rsp[10:14])))
	return nil
}

// setReal records that the TPM knows the client's handle v as real.
func (cl *client) setReal(v, real tpm2.TPMHandle) {
	if v == real {
		delete(cl.real, v)
		return
	}
	if cl.real == nil {
		cl.real = map[tpm2.TPMHandle]tpm2.TPMHandle{}
	}
	cl.real[v] = real
}

// roundTripEvictingLocked runs cmd for cl, swapping out one other
// client's object at a time while the TPM answers TPM_RC_OBJECT_MEMORY.
func (r *Relay) roundTripEvictingLocked(cl *client, cmd []byte) ([]byte, error) {
	for {
		rsp, err := r.roundTripLocked(cmd)
		// Without the TPM's command list the relay cannot rewrite
		// handles, so it must not move objects.
		if err != nil || ResponseCode(rsp) != rcObjectMemory || r.opts.KeepObjects || len(r.counts) == 0 {
			return rsp, err
		}
		ok, err := r.evictOneLocked(cl)
		if err != nil || !ok {
			return rsp, err
		}
	}
}

// evictOneLocked swaps out one loaded object of a client other than cl;
// false when there is none.
func (r *Relay) evictOneLocked(cl *client) (bool, error) {
	for _, other := range r.clients {
		if other == cl {
			continue
		}
		for v := range other.objects {
			if uint32(v)>>24 != htTransient || other.saved[v] != nil {
				continue
			}
			return true, r.swapOutLocked(other, v)
		}
	}
	return false, nil
}

// swapOutLocked saves the client's loaded object v and flushes it.
func (r *Relay) swapOutLocked(cl *client, v tpm2.TPMHandle) error {
	real := tpm2.TPMHandle(cl.realHandle(uint32(v)))
	save := make([]byte, 14)
	binary.BigEndian.PutUint16(save[0:2], uint16(tpm2.TPMSTNoSessions))
	binary.BigEndian.PutUint32(save[2:6], 14)
	binary.BigEndian.PutUint32(save[6:10], uint32(tpm2.TPMCCContextSave))
	binary.BigEndian.PutUint32(save[10:14], uint32(real))
	saved, err := r.roundTripLocked(save)
	if err != nil {
		return err
	}
	if ResponseCode(saved) != 0 {
		return fmt.Errorf("swap out another client's object (TPM2_ContextSave 0x%08x): response code 0x%x", uint32(real), ResponseCode(saved))
	}
	rsp, err := r.roundTripLocked(flushCommand(real))
	if err == nil && ResponseCode(rsp) != 0 {
		err = fmt.Errorf("TPM2_FlushContext 0x%08x after saving it: response code 0x%x", uint32(real), ResponseCode(rsp))
	}
	if err != nil {
		return err
	}
	if cl.saved == nil {
		cl.saved = map[tpm2.TPMHandle][]byte{}
	}
	cl.saved[v] = saved[10:] // the TPMS_CONTEXT
	delete(cl.real, v)
	return nil
}

// flushSaved answers the client's FlushContext of one of its
// swapped-out objects itself (nothing is loaded to flush); nil otherwise.
func (cl *client) flushSaved(cmd []byte) []byte {
	if CommandCode(cmd) != tpm2.TPMCCFlushContext || len(cmd) < 14 {
		return nil
	}
	v := tpm2.TPMHandle(binary.BigEndian.Uint32(cmd[10:14]))
	if _, ok := cl.saved[v]; !ok {
		return nil
	}
	delete(cl.saved, v)
	delete(cl.objects, v)
	return refusal(0)
}

// newHandle records a handle the TPM just created for the client and
// returns the client's handle for it: the same number, unless the client
// already uses that number for an object that was moved (then a free
// one, which rsp is rewritten to carry: the next lower transient number,
// wrapping from the lowest to the highest).
func (cl *client) newHandle(rsp []byte, h uint32) tpm2.TPMHandle {
	v := tpm2.TPMHandle(h)
	for h>>24 == htTransient && cl.owns(uint32(v)) {
		v = tpm2.TPMHandle(htTransient<<24 | (uint32(v)-1)&0xFFFFFF)
	}
	if v != tpm2.TPMHandle(h) {
		cl.setReal(v, tpm2.TPMHandle(h))
		binary.BigEndian.PutUint32(rsp[10:14], uint32(v))
	}
	cl.objects[v] = struct{}{}
	return v
}

// forget drops the client's handle v.
func (cl *client) forget(v tpm2.TPMHandle) {
	delete(cl.objects, v)
	delete(cl.real, v)
	delete(cl.saved, v)
}
