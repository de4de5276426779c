// Package relay lets several processes share one TPM that serves a single
// connection (swtpm's data socket), the way the kernel resource manager
// (/dev/tpmrm0) lets them share a chip: every client's whole command and
// response pass one at a time over one upstream connection, and the
// transient objects a client loaded are flushed when it disconnects.
//
// It can also make the TPM slow: a per-command latency (e.g. 60 ms for
// TPM2_Sign, a discrete chip's speed) is spent while the TPM is held, so
// swtpm behaves like real hardware for benchmarks.
//
// Unlike a real resource manager it does not virtualize handles: clients
// see the TPM's own handle numbers. Sessions are not flushed on
// disconnect, because the TPM frees a session by itself when a command
// uses it without continueSession, and its handle number may already
// belong to another client's session.
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
	// KeepObjects leaves a departed client's transient objects loaded, as
	// a TPM without a resource manager (/dev/tpm0) does, so that tests can
	// show what a killed client leaves behind there.
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
}

// client is one connection and the transient objects it has loaded.
type client struct {
	conn    net.Conn
	objects map[tpm2.TPMHandle]struct{}
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
	for c, cl := range r.clients {
		clear(cl.objects)
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

// remove flushes the client's transient objects and forgets it.
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
			if _, err := r.roundTripLocked(flushCommand(h)); err != nil {
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
	start := time.Now()
	rsp, err := r.roundTripLocked(cmd)
	if err != nil {
		return nil, err
	}
	cc := CommandCode(cmd)
	if d := r.opts.Latency[cc]; d > 0 {
		time.Sleep(d - time.Since(start))
	}
	if r.log.Enabled(context.Background(), slog.LevelDebug) {
		r.log.Debug("TPM command", "command", commandName(cc), "response_code", fmt.Sprintf("0x%x", ResponseCode(rsp)), "took", time.Since(start))
	}
	cl.track(cc, cmd, rsp)
	return rsp, nil
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

// Commands whose response's first handle is a new transient object
// (TPM 2.0 Part 3: CreatePrimary §24.1, Load §12.2, LoadExternal §12.3,
// ContextLoad §28.3, CreateLoaded §12.9, HashSequenceStart §17.3).
var createsObject = map[tpm2.TPMCC]bool{
	tpm2.TPMCCCreatePrimary: true, tpm2.TPMCCLoad: true, tpm2.TPMCCLoadExternal: true,
	tpm2.TPMCCContextLoad: true, tpm2.TPMCCCreateLoaded: true, tpm2.TPMCCHashSequenceStart: true,
}

// transientFirst is the first transient object handle (TPM 2.0 Part 2
// §7.4, TPM_HT_TRANSIENT).
const transientFirst = 0x80000000

// track records transient objects the client created and forgets the
// ones it flushed.
func (cl *client) track(cc tpm2.TPMCC, cmd, rsp []byte) {
	if ResponseCode(rsp) != 0 {
		return
	}
	switch {
	case createsObject[cc] && len(rsp) >= 14:
		// Response: header, then the handle area (Part 1 §18.8).
		if h := tpm2.TPMHandle(binary.BigEndian.Uint32(rsp[10:14])); h >= transientFirst {
			cl.objects[h] = struct{}{}
		}
	case cc == tpm2.TPMCCFlushContext && len(cmd) >= 14:
		// FlushContext's handle is a parameter (Part 3 §28.4).
		delete(cl.objects, tpm2.TPMHandle(binary.BigEndian.Uint32(cmd[10:14])))
	}
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
