package tpmsim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/tpmsim/relay"
)

// SwtpmOptions configures StartSwtpm.
type SwtpmOptions struct {
	// StateDir holds the TPM state; empty means a fresh temporary one.
	// Two Swtpm with different state dirs are two different TPMs.
	StateDir string
	// TCP makes the client socket a TCP listener on 127.0.0.1 (a free
	// port the harness holds, so there is no port race) instead of a unix
	// socket.
	TCP bool
	// Latency makes the TPM slow: it is added to every command with that
	// code (e.g. tpm2.TPMCCSign: 60 * time.Millisecond for a discrete
	// chip), spent while the TPM is held.
	Latency map[tpm2.TPMCC]time.Duration
	// NoResourceManager makes the relay leave a departed client's
	// transient objects loaded, like /dev/tpm0 (no kernel resource
	// manager) does, instead of flushing them like /dev/tpmrm0, and
	// lets clients see and flush each other's.
	NoResourceManager bool
	// Tools also serves tpm2-tools through the relay (TCTI returns their
	// TPM2TOOLS_TCTI).
	Tools bool
}

// Swtpm is a real swtpm process for tests. swtpm serves one connection at
// a time, so clients (the signer under test, a daemon process, the test's
// own ExtendPCR) reach it through a relay.Relay that forwards whole
// commands one at a time over a single swtpm connection. When swtpm dies
// every client connection is closed, as a real TPM's would be.
type Swtpm struct {
	tb       testing.TB
	bin      string
	stateDir string
	sockDir  string
	raw      string // swtpm's own data socket
	ctrl     string
	log      string

	ln    net.Listener
	relay *relay.Relay
	tcti  string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	closed bool
	served chan struct{} // closed when the relay stops serving
}

// StartSwtpm starts swtpm (swtpm socket --tpm2 ... --flags
// not-need-init,startup-clear) with its sockets in a fresh directory, waits
// until it answers, and registers a cleanup that checks for leaked handles
// and stops it. A missing swtpm skips the test, or fails it when
// DevicesRequired.
func StartSwtpm(tb testing.TB, opts SwtpmOptions) *Swtpm {
	tb.Helper()
	bin := RequireTool(tb, "swtpm")
	// Unix socket paths are limited to 108 bytes, which t.TempDir() under
	// long test names can exceed.
	sockDir, err := os.MkdirTemp("", "swtpm")
	if err != nil {
		tb.Fatal(err)
	}
	state := opts.StateDir
	if state == "" {
		state = tb.TempDir()
	}
	s := &Swtpm{
		tb: tb, bin: bin, stateDir: state, sockDir: sockDir,
		raw:    filepath.Join(sockDir, "tpm.sock"),
		ctrl:   filepath.Join(sockDir, "ctrl.sock"),
		log:    filepath.Join(sockDir, "swtpm.log"),
		served: make(chan struct{}),
	}
	s.relay, err = relay.New(relay.Options{Upstream: s.dialRaw, Latency: opts.Latency, KeepObjects: opts.NoResourceManager})
	if err != nil {
		os.RemoveAll(sockDir)
		tb.Fatal(err)
	}
	if opts.TCP {
		s.ln, err = net.Listen("tcp", "127.0.0.1:0")
	} else {
		s.ln, err = net.Listen("unix", filepath.Join(sockDir, "relay.sock"))
	}
	if err != nil {
		os.RemoveAll(sockDir)
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if s.Running() {
			s.CheckNoLeaks(tb)
		}
		s.Close()
	})
	if err := s.start(); err != nil {
		tb.Fatal(err)
	}
	go func() { defer close(s.served); s.relay.Serve(s.ln) }()
	if opts.Tools {
		s.serveTools(tb)
	}
	return s
}

// serveTools serves tpm2-tools' swtpm TCTI through the relay until the
// test ends.
func (s *Swtpm) serveTools(tb testing.TB) {
	data, ctrl, err := relay.ListenTCTI("127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { data.Close(); ctrl.Close() })
	go s.relay.Serve(data)
	go s.relay.ServeControl(ctrl)
	s.tcti = fmt.Sprintf("swtpm:host=127.0.0.1,port=%d", data.Addr().(*net.TCPAddr).Port)
}

// TCTI is the TPM2TOOLS_TCTI value that reaches this TPM through the
// relay (SwtpmOptions.Tools).
func (s *Swtpm) TCTI() string { return s.tcti }

// dialRaw connects to swtpm's own socket, for the relay.
func (s *Swtpm) dialRaw(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", s.raw)
}

// Device is the tpm.Device clients use (the relay socket).
func (s *Swtpm) Device() tpm.Device {
	if s.ln.Addr().Network() == "tcp" {
		return tpm.Device{Kind: tpm.DeviceTCP, Addr: s.ln.Addr().String()}
	}
	return tpm.Device{Kind: tpm.DeviceUnix, Addr: s.ln.Addr().String()}
}

// URIAttrs is the key URI attribute naming this TPM, e.g.
// "socket=/tmp/swtpm123/relay.sock", to append to a tpm: key URI.
func (s *Swtpm) URIAttrs() string { return s.Device().String() }

// Addr is the relay's address (socket path or 127.0.0.1:port).
func (s *Swtpm) Addr() string { return s.ln.Addr().String() }

// RawSocket is swtpm's own data socket. Only one client can use it at a
// time and the relay holds it while any relay client is active; it is
// for benchmarks that want no relay in the path.
func (s *Swtpm) RawSocket() string { return s.raw }

// StateDir is the TPM state directory.
func (s *Swtpm) StateDir() string { return s.stateDir }

// Dial implements tpm.DialFunc: a connection through the relay.
func (s *Swtpm) Dial(ctx context.Context, _ tpm.Device) (transport.TPMCloser, error) {
	return Dial(ctx, s.Device())
}

func (s *Swtpm) dialRelay() (transport.TPMCloser, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.Dial(ctx, s.Device())
}

// ExtendPCR extends sha256 PCR idx with SHA-256(data), failing tb on error.
func (s *Swtpm) ExtendPCR(tb testing.TB, idx int, data []byte) {
	tb.Helper()
	c, err := s.dialRelay()
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	if err := ExtendPCR(c, idx, data); err != nil {
		tb.Fatal(err)
	}
}

// CheckNoLeaks fails tb if swtpm holds transient objects or sessions,
// whichever client loaded them (asked by the relay itself: a client sees
// only its own).
func (s *Swtpm) CheckNoLeaks(tb testing.TB) {
	tb.Helper()
	hs, err := s.relay.LoadedHandles()
	if err != nil {
		tb.Fatal(err)
	}
	if len(hs) > 0 {
		tb.Errorf("TPM handles leaked: %v", handleNames(hs))
	}
}

// LoadedHandles lists every transient object and session in swtpm.
func (s *Swtpm) LoadedHandles() ([]tpm2.TPMHandle, error) { return s.relay.LoadedHandles() }

func (s *Swtpm) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	os.Remove(s.raw)
	os.Remove(s.ctrl)
	cmd := exec.Command(s.bin, "socket", "--tpm2",
		"--tpmstate", "dir="+s.stateDir,
		"--server", "type=unixio,path="+s.raw,
		"--ctrl", "type=unixio,path="+s.ctrl,
		"--flags", "not-need-init,startup-clear",
		"--log", "file="+s.log)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start swtpm: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(10 * time.Second)
	for {
		// swtpm creates the socket file at bind(), before listen(): only a
		// successful connection shows that it accepts.
		if c, err := net.Dial("unix", s.raw); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(s.log)
			return fmt.Errorf("swtpm exited at start: %s", log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			return errors.New("swtpm did not accept connections within 10s")
		}
	}
}

// Running reports whether the swtpm process is up.
func (s *Swtpm) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// Kill SIGKILLs swtpm and closes every client connection, as if the TPM
// vanished. The state directory survives.
func (s *Swtpm) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	s.relay.Reset()
	if cmd != nil {
		cmd.Process.Kill()
		<-exited
	}
}

// Restart starts swtpm again with the same state: persistent objects and
// the SRK seed survive; PCRs are reset (startup-clear).
func (s *Swtpm) Restart(tb testing.TB) {
	tb.Helper()
	s.Kill()
	if err := s.start(); err != nil {
		tb.Fatal(err)
	}
}

// Close stops swtpm and the relay and removes the socket directory.
func (s *Swtpm) Close() error {
	s.Kill()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	err := s.ln.Close()
	<-s.served
	s.relay.Close()
	os.RemoveAll(s.sockDir)
	return err
}
