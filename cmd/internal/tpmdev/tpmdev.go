// Package tpmdev opens TPMs for the tpm signer backend: Linux TPM character
// devices and swtpm sockets. It is the one place in the binaries that opens
// a TPM; signer/tpm only receives the connection.
package tpmdev

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/google/go-tpm/tpm2/transport"
	"github.com/google/go-tpm/tpm2/transport/linuxtpm"

	"github.com/steward-trustd/steward-trustd/signer/tpm"
)

// Default character devices, in order of preference: the kernel resource
// manager (which flushes what a crashed client left and lets several
// clients share the TPM), then the raw device.
const (
	ResourceManagerDevice = "/dev/tpmrm0"
	RawDevice             = "/dev/tpm0"
)

// Dial implements tpm.DialFunc for real devices and swtpm sockets.
func Dial(ctx context.Context, dev tpm.Device) (transport.TPMCloser, error) {
	switch dev.Kind {
	case tpm.DeviceAuto:
		t, err := openChar(ResourceManagerDevice)
		if err == nil || !errors.Is(err, fs.ErrNotExist) {
			return t, err
		}
		t, err2 := openChar(RawDevice)
		if err2 != nil {
			return nil, fmt.Errorf("no TPM found (%w; %w); name one with device=, swtpm= or socket=", err, err2)
		}
		return t, nil
	case tpm.DeviceChar:
		return openChar(dev.Addr)
	case tpm.DeviceTCP:
		return DialSocket(ctx, "tcp", dev.Addr)
	case tpm.DeviceUnix:
		return DialSocket(ctx, "unix", dev.Addr)
	}
	return nil, fmt.Errorf("unknown TPM device kind %d", dev.Kind)
}

// openChar opens a TPM character device. The kernel driver returns a whole
// response per read, which go-tpm's linuxtpm transport relies on.
func openChar(path string) (transport.TPMCloser, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("open TPM %s: %w", path, err)
	}
	if st.Mode()&fs.ModeCharDevice == 0 {
		return nil, fmt.Errorf("open TPM %s: not a character device", path)
	}
	t, err := linuxtpm.Open(path)
	if err != nil {
		return nil, openError(path, err)
	}
	return t, nil
}

// openError wraps a failed open of a TPM character device. The raw device
// admits one open at a time and answers another with EBUSY (TPM 2.0 has
// no multi-client protocol; the kernel's resource manager adds one).
func openError(path string, err error) error {
	if errors.Is(err, syscall.EBUSY) {
		return fmt.Errorf("open TPM %s: %w: %s", path, err, busyDeviceHint)
	}
	return fmt.Errorf("open TPM %s: %w", path, err)
}

// busyDeviceHint and busySocketHint say what to do when a TPM refuses or
// drops a second client.
const (
	busyDeviceHint = "another process may hold the TPM connection: " +
		"use the kernel resource manager " + ResourceManagerDevice + " (device=" + ResourceManagerDevice + "), which lets the daemon and the ceremony share the TPM"
	busySocketHint = "another process may hold the TPM connection (swtpm serves one client at a time): " +
		"run swtpm behind steward-tpm-relay (steward-tpm-relay --upstream SWTPM-SOCKET --listen RELAY-SOCKET) and point every process at the relay's socket, " +
		"or use a real TPM through " + ResourceManagerDevice
)

// ProbeTimeout bounds how long DialSocket waits for the TPM to answer its
// first command. swtpm accepts a second connection but does not read from
// it while another client is connected, so without a bound the second
// process would hang; a relay answers within a few TPM commands' time.
const ProbeTimeout = 10 * time.Second

// probeCommand is TPM2_GetRandom for one byte (TPM 2.0 Part 3 §16.1):
// tag TPM_ST_NO_SESSIONS, size 12, TPM_CC_GetRandom, bytesRequested 1. It
// changes no TPM state; any response, even an error code, proves the TPM
// reads this connection.
var probeCommand = [...]byte{0x80, 0x01, 0, 0, 0, 12, 0, 0, 0x01, 0x7b, 0, 1}

// DialSocket connects to a swtpm --server socket ("tcp" host:port or
// "unix" path) that carries raw TPM 2.0 commands, and frames responses by
// their header (tpm.NewStreamTransport).
// A socket that refuses the connection, drops it, or does not answer a
// first command within ProbeTimeout gives an error that says another
// process may hold the TPM connection and what to do.
func DialSocket(ctx context.Context, network, addr string) (transport.TPMCloser, error) {
	return dialSocket(ctx, network, addr, ProbeTimeout)
}

func dialSocket(ctx context.Context, network, addr string, probe time.Duration) (transport.TPMCloser, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EAGAIN) {
			return nil, fmt.Errorf("connect to TPM socket %s: %w: is swtpm (or steward-tpm-relay) running? If it is, %s", addr, err, busySocketHint)
		}
		return nil, fmt.Errorf("connect to TPM socket %s: %w", addr, err)
	}
	t := &socketTPM{TPMCloser: tpm.NewStreamTransport(c), addr: addr}
	if err := probeSocket(ctx, c, t, probe); err != nil {
		err = errors.Join(err, c.Close())
		return nil, err
	}
	return t, nil
}

// probeSocket sends probeCommand with a deadline, so a TPM that accepted
// the connection but serves another client fails now with a clear error
// instead of hanging the first real command.
func probeSocket(ctx context.Context, c net.Conn, t *socketTPM, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := c.SetDeadline(deadline); err != nil {
		return fmt.Errorf("TPM socket %s: %w", t.addr, err)
	}
	_, err := t.Send(probeCommand[:])
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("TPM socket %s accepted the connection but did not answer within %v: %s", t.addr, timeout, busySocketHint)
	}
	if err != nil {
		return err
	}
	return c.SetDeadline(time.Time{})
}

// socketTPM adds the busy-TPM hint to a dropped connection's errors.
type socketTPM struct {
	transport.TPMCloser
	addr string
}

// Send implements transport.TPM.
func (s *socketTPM) Send(cmd []byte) ([]byte, error) {
	rsp, err := s.TPMCloser.Send(cmd)
	if isDropped(err) {
		return nil, fmt.Errorf("TPM socket %s closed the connection: %w: swtpm stopped, or %s", s.addr, err, busySocketHint)
	}
	return rsp, err
}

// isDropped reports the errors of a peer that closed the connection.
func isDropped(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
