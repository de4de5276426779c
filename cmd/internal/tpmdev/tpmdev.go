// Package tpmdev opens TPMs for the tpm signer backend: Linux TPM character
// devices and swtpm sockets. It is the one place in the binaries that opens
// a TPM; signer/tpm only receives the connection.
package tpmdev

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"

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
		return nil, fmt.Errorf("open TPM %s: %w", path, err)
	}
	return t, nil
}

// DialSocket connects to a swtpm --server socket ("tcp" host:port or
// "unix" path) that carries raw TPM 2.0 commands, and frames responses by
// their header (tpm.NewStreamTransport).
func DialSocket(ctx context.Context, network, addr string) (transport.TPMCloser, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("connect to TPM socket %s: %w", addr, err)
	}
	return tpm.NewStreamTransport(c), nil
}
