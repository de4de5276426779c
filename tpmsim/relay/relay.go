// Package relay lets several processes share one TPM that serves a single
// connection (swtpm's data socket), the way the kernel resource manager
// (/dev/tpmrm0) lets them share a chip: every client's whole command and
// response pass one at a time over one upstream connection; each client
// sees, uses and flushes only its own transient objects and sessions
// (isolation.go), which are flushed when it disconnects. A control port
// (control.go) speaks enough of swtpm's control protocol for tpm2-tools'
// swtpm TCTI, and refuses what would reset the TPM under other clients.
//
// It can also make the TPM slow: a per-command latency (e.g. 60 ms for
// TPM2_Sign, a discrete chip's speed) is spent while the TPM is held, so
// swtpm behaves like real hardware for benchmarks.
//
// Like a real resource manager it swaps other clients' objects out when
// the TPM's few object slots are full (swap.go); unlike one it does not
// swap sessions, so clients share the TPM's session slots.
package relay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/google/go-tpm/tpm2"
)

// Options configures a Relay.
type Options struct {
	// Upstream connects to the TPM. Required. It is called when the first
	// command arrives and again after the connection was dropped.
	Upstream func(context.Context) (net.Conn, error)
	// Latency is added to every command with that code, spent while the
	// TPM is held (so it serializes like device time).
	Latency map[tpm2.TPMCC]time.Duration
	// Log receives one line per client that could not be served or cleaned
	// up, and at debug level one per command. Nil discards.
	Log *slog.Logger
	// KeepUpstream keeps the TPM connection open while no client is
	// connected. By default it is closed, so that another program can
	// use swtpm's socket directly in between.
	KeepUpstream bool
	// KeepObjects makes the relay behave as a TPM without a resource
	// manager (/dev/tpm0) does: a departed client's transient objects stay
	// loaded and clients are not isolated from each other, so that tests
	// can show what a killed client leaves behind there.
	KeepObjects bool
}

// Relay serves TPM clients; see the package comment.
type Relay struct {
	opts Options
	log  *slog.Logger

	mu       sync.Mutex // held for a whole command: the TPM does one at a time
	upstream net.Conn
	clients  map[net.Conn]*client
	closed   bool
	wg       sync.WaitGroup
	// counts is the TPM's handle count per command, learnt once; nil
	// until then or when the TPM did not say (then only flushes are
	// checked).
	counts handleCounts
}

// client is one connection and the transient objects and sessions it
// has loaded (objects holds both).
type client struct {
	conn    net.Conn
	objects map[tpm2.TPMHandle]struct{}
	// real maps the client's handles that the TPM now knows by another
	// number; saved holds the contexts of its swapped-out objects
	// (swap.go).
	real  map[tpm2.TPMHandle]tpm2.TPMHandle
	saved map[tpm2.TPMHandle][]byte
}

// New returns a relay; Serve starts it.
func New(opts Options) (*Relay, error) {
	if opts.Upstream == nil {
		return nil, errors.New("relay: no upstream TPM")
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Relay{opts: opts, log: log, clients: map[net.Conn]*client{}}, nil
}

// Serve accepts clients on ln until ln is closed or Close is called.
func (r *Relay) Serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			r.mu.Lock()
			closed := r.closed
			r.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("relay: accept: %w", err)
		}
		if !r.add(c) {
			c.Close()
			return nil
		}
		go r.serve(c)
	}
}

func (r *Relay) add(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.clients[c] = &client{conn: c, objects: map[tpm2.TPMHandle]struct{}{}}
	r.wg.Add(1)
	return true
}

// Reset drops the TPM connection and every client, as a vanished TPM
// would (e.g. after swtpm was killed): clients must reconnect. The
// clients' objects are forgotten, not flushed: a restarted TPM has none,
// and their handle numbers may soon name another client's objects.
func (r *Relay) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropUpstreamLocked()
	r.counts = nil // a restarted TPM may be another one
	for c, cl := range r.clients {
		clear(cl.objects)
		clear(cl.real)
		clear(cl.saved)
		c.Close()
	}
}

// Close stops the relay: every client is disconnected and Serve returns
// once its listener is closed by the caller. It waits for the clients'
// goroutines.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.Reset()
	r.wg.Wait()
	return nil
}

// serve relays one client's commands, one whole command and response at
// a time, and cleans up after it.
func (r *Relay) serve(c net.Conn) {
	defer r.wg.Done()
	defer r.remove(c)
	for {
		cmd, err := ReadFrame(c)
		if err != nil {
			return
		}
		rsp, err := r.forward(c, cmd)
		if err != nil {
			r.log.Warn("TPM relay: dropping client", "error", err)
			return
		}
		if _, err := c.Write(rsp); err != nil {
			return
		}
	}
}

// remove flushes the client's loaded objects and sessions and forgets it.
func (r *Relay) remove(c net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cl := r.clients[c]
	delete(r.clients, c)
	c.Close()
	if cl != nil && !r.opts.KeepObjects {
		// Over a fresh connection if need be: swtpm keeps objects across
		// connections.
		for h := range cl.objects {
			if _, saved := cl.saved[h]; saved {
				continue
			}
			if _, err := r.roundTripLocked(flushCommand(tpm2.TPMHandle(cl.realHandle(uint32(h))))); err != nil {
				r.log.Warn("TPM relay: flush of a departed client's object failed", "handle", fmt.Sprintf("0x%08x", uint32(h)), "error", err)
				break
			}
		}
	}
	if len(r.clients) == 0 && !r.opts.KeepUpstream {
		r.dropUpstreamLocked()
	}
}

// forward sends one command upstream and returns its response, after
// the command's latency.
func (r *Relay) forward(c net.Conn, cmd []byte) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cl, ok := r.clients[c]
	if !ok {
		return nil, errors.New("client reset")
	}
	cc := CommandCode(cmd)
	nh := r.handleCountLocked(cc)
	if rsp := r.isolateLocked(cl, cmd, nh); rsp != nil {
		return rsp, nil
	}
	if rsp := cl.flushSaved(cmd); rsp != nil {
		return rsp, nil
	}
	start := time.Now()
	real, err := r.toRealLocked(cl, cmd, nh)
	if err != nil {
		return nil, err
	}
	rsp, err := r.roundTripEvictingLocked(cl, real)
	if err != nil {
		return nil, err
	}
	if d := r.opts.Latency[cc]; d > 0 {
		time.Sleep(d - time.Since(start))
	}
	if r.log.Enabled(context.Background(), slog.LevelDebug) {
		// start_us (µs since the epoch) with took gives when the device
		// was busy and when it idled between commands.
		r.log.Debug("TPM command", "command", commandName(cc), "response_code", fmt.Sprintf("0x%x", ResponseCode(rsp)), "took", time.Since(start), "start_us", start.UnixMicro())
	}
	if h, ok := cl.track(cc, cmd, rsp, nh); ok && uint32(h)>>24 != htTransient {
		r.disownLocked(cl, h)
	}
	return rsp, nil
}

// listCommandsLocked asks the TPM for its commands' handle counts
// (bounded: at most 16 pages).
func (r *Relay) listCommandsLocked() (handleCounts, error) {
	hc := handleCounts{}
	next := uint32(0x11F) // TPM_CC_FIRST (Part 2 §6.5.2)
	for range 16 {
		rsp, err := r.roundTripLocked(commandsQuery(next))
		if err != nil {
			return hc, err
		}
		if next, err = hc.parseCommands(rsp); err != nil || next == 0 {
			return hc, err
		}
	}
	return hc, nil
}

// isolateLocked answers a command the relay does not forward: one naming
// another client's handle (refused), or a listing of loaded handles (the
// client's own). Nil: forward it.
func (r *Relay) isolateLocked(cl *client, cmd []byte, nh int) []byte {
	if r.opts.KeepObjects {
		return nil
	}
	if rc := cl.foreign(cmd, nh); rc != 0 {
		r.log.Warn("TPM relay: refused a command naming another client's object or session (TPM_RC_HANDLE)", "command", commandName(CommandCode(cmd)), "response_code", fmt.Sprintf("0x%x", rc))
		return refusal(rc)
	}
	if property, count, ok := handlesQuery(cmd); ok {
		return cl.ownHandles(property, count)
	}
	return nil
}

// disownLocked forgets session h in every client but cl: the TPM just
// gave it to cl, so any other claim on it was stale (a session the TPM
// ended). Object handles are per client (swap.go) and not disowned.
func (r *Relay) disownLocked(cl *client, h tpm2.TPMHandle) {
	for _, other := range r.clients {
		if other != cl {
			delete(other.objects, h)
		}
	}
}

// handleCountLocked is cc's handle count, -1 when unknown. The table is
// asked of the TPM once.
func (r *Relay) handleCountLocked(cc tpm2.TPMCC) int {
	if r.opts.KeepObjects {
		return -1
	}
	if r.counts == nil {
		hc, err := r.listCommandsLocked()
		if err != nil && r.upstream == nil {
			return -1 // the TPM is unreachable: ask again with the next command
		}
		if err != nil {
			r.log.Warn("TPM relay: the TPM did not list its commands; only flushes of other clients' handles are refused, and objects are not swapped", "error", err)
		}
		r.counts = hc
	}
	if n, ok := r.counts[cc]; ok {
		return n
	}
	return -1
}

func (r *Relay) roundTripLocked(cmd []byte) ([]byte, error) {
	if r.upstream == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		u, err := r.opts.Upstream(ctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("connect to the TPM: %w", err)
		}
		r.upstream = u
	}
	r.upstream.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := r.upstream.Write(cmd); err != nil {
		r.dropUpstreamLocked()
		return nil, fmt.Errorf("send to the TPM: %w", err)
	}
	rsp, err := ReadFrame(r.upstream)
	if err != nil {
		r.dropUpstreamLocked()
		return nil, fmt.Errorf("read from the TPM: %w", err)
	}
	return rsp, nil
}

func (r *Relay) dropUpstreamLocked() {
	if r.upstream != nil {
		r.upstream.Close()
		r.upstream = nil
	}
}

// Commands whose response's first handle is a new transient object or
// session (TPM 2.0 Part 3: CreatePrimary §24.1, Load §12.2, LoadExternal
// §12.3, ContextLoad §28.3, CreateLoaded §12.9, HashSequenceStart §17.3,
// HMAC_Start §17.2, StartAuthSession §11.1).
var createsHandle = map[tpm2.TPMCC]bool{
	tpm2.TPMCCCreatePrimary: true, tpm2.TPMCCLoad: true, tpm2.TPMCCLoadExternal: true,
	tpm2.TPMCCContextLoad: true, tpm2.TPMCCCreateLoaded: true, tpm2.TPMCCHashSequenceStart: true,
	tpm2.TPMCCHMACStart: true, tpm2.TPMCCStartAuthSession: true,
}

// Commands that end the sequence object of their first handle (Part 3
// §17.5 SequenceComplete, §17.6 EventSequenceComplete).
var endsSequence = map[tpm2.TPMCC]bool{tpm2.TPMCCSequenceComplete: true, tpm2.TPMCCEventSequenceComplete: true}

// track records the objects and sessions the client created and forgets
// the ones it flushed or that the command ended; it returns a handle the
// TPM just created.
func (cl *client) track(cc tpm2.TPMCC, cmd, rsp []byte, nHandles int) (tpm2.TPMHandle, bool) {
	if ResponseCode(rsp) != 0 {
		return 0, false
	}
	for _, s := range sessionsOf(cmd, nHandles) {
		if s.ends && s.handle>>24 != htTransient {
			cl.forget(tpm2.TPMHandle(s.handle))
		}
	}
	switch {
	case createsHandle[cc] && len(rsp) >= 14:
		// Response: header, then the handle area (Part 1 §18.8).
		if h := binary.BigEndian.Uint32(rsp[10:14]); ownable(h) {
			return cl.newHandle(rsp, h), true
		}
	case (cc == tpm2.TPMCCFlushContext || endsSequence[cc]) && len(cmd) >= 14:
		// FlushContext's handle is a parameter (Part 3 §28.4), the
		// sequence's the first handle; cmd holds the client's handles.
		cl.forget(tpm2.TPMHandle(binary.BigEndian.Uint32(cmd[10:14])))
	}
	return 0, false
}

// flushCommand is TPM2_FlushContext(h) (Part 3 §28.4): no sessions.
func flushCommand(h tpm2.TPMHandle) []byte {
	b := make([]byte, 14)
	binary.BigEndian.PutUint16(b[0:2], uint16(tpm2.TPMSTNoSessions))
	binary.BigEndian.PutUint32(b[2:6], 14)
	binary.BigEndian.PutUint32(b[6:10], uint32(tpm2.TPMCCFlushContext))
	binary.BigEndian.PutUint32(b[10:14], uint32(h))
	return b
}

// maxFrame bounds a command or response: far above TPM2's largest
// (MAX_COMMAND_SIZE is 4 KiB on common chips).
const maxFrame = 1 << 16

// ReadFrame reads one TPM command or response: the 10-byte header (tag,
// size, command or response code; TPM 2.0 Part 1 §18.2) whose size is
// the whole frame's, then the rest.
func ReadFrame(rd io.Reader) ([]byte, error) {
	var hdr [10]byte
	if _, err := io.ReadFull(rd, hdr[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(hdr[2:6])
	if size < 10 || size > maxFrame {
		return nil, fmt.Errorf("bad TPM frame size %d", size)
	}
	buf := make([]byte, size)
	copy(buf, hdr[:])
	if _, err := io.ReadFull(rd, buf[10:]); err != nil {
		return nil, err
	}
	return buf, nil
}

// CommandCode is a command frame's code (header bytes 6–9, Part 1 §18.2).
func CommandCode(cmd []byte) tpm2.TPMCC {
	if len(cmd) < 10 {
		return 0
	}
	return tpm2.TPMCC(binary.BigEndian.Uint32(cmd[6:10]))
}

// ResponseCode is a response frame's code (header bytes 6–9).
func ResponseCode(rsp []byte) uint32 {
	if len(rsp) < 10 {
		return 0
	}
	return binary.BigEndian.Uint32(rsp[6:10])
}
