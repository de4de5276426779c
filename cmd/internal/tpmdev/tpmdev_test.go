package tpmdev

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/signertest"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

func TestDialSwtpm(t *testing.T) {
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	swTCP := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{TCP: true})
	for _, dev := range []tpm.Device{
		{Kind: tpm.DeviceUnix, Addr: sw.RawSocket()}, // swtpm itself, no relay
		swTCP.Device(),
	} {
		t.Run(dev.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := Dial(ctx, dev)
			if err != nil {
				t.Fatal(err)
			}
			rsp, err := tpm2.GetRandom{BytesRequested: 32}.Execute(c)
			c.Close()
			if err != nil || len(rsp.RandomBytes.Buffer) != 32 {
				t.Fatalf("GetRandom = %v, %v", rsp, err)
			}
		})
	}
	t.Run("signer", func(t *testing.T) {
		b := &tpm.Backend{Dial: Dial}
		uri := "tpm:path=" + filepath.Join(t.TempDir(), "k") + ";socket=" + sw.RawSocket()
		s, err := b.Generate(context.Background(), uri, signer.ECDSAP256)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		signertest.Run(t, s, signertest.Options{Concurrency: 2, SignaturesPerGoroutine: 2})
	})
}

func TestDialErrors(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		dev  tpm.Device
		want string
	}{
		{tpm.Device{Kind: tpm.DeviceChar, Addr: "/nonexistent/tpm"}, "no such file"},
		{tpm.Device{Kind: tpm.DeviceChar, Addr: "/etc/hostname"}, "not a character device"},
		{tpm.Device{Kind: tpm.DeviceUnix, Addr: filepath.Join(t.TempDir(), "none.sock")}, "connect to TPM socket"},
		{tpm.Device{Kind: tpm.DeviceKind(42)}, "unknown TPM device kind"},
	}
	for _, tt := range tests {
		t.Run(tt.dev.String(), func(t *testing.T) {
			c, err := Dial(ctx, tt.dev)
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Dial = %v, want %q", err, tt.want)
			}
		})
	}
}

// TestDialBusy: a second process reaching a TPM that serves one client
// (swtpm's own socket, a socket that drops or refuses it) fails fast with
// the busy-TPM hint instead of hanging; through the relay both work.
func TestDialBusy(t *testing.T) {
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	ctx := context.Background()
	first, err := Dial(ctx, tpm.Device{Kind: tpm.DeviceUnix, Addr: sw.RawSocket()})
	if err != nil {
		t.Fatal(err)
	}
	second, err := dialSocket(ctx, "unix", sw.RawSocket(), 300*time.Millisecond)
	if err == nil {
		second.Close()
		t.Fatal("a second connection to swtpm's own socket was served")
	}
	wantBusy(t, err, "did not answer within 300ms")
	first.Close()
	again, err := dialSocket(ctx, "unix", sw.RawSocket(), 5*time.Second)
	if err != nil {
		t.Fatalf("after the first client left: %v", err)
	}
	again.Close()

	dropping := listenUnix(t, func(c net.Conn) { c.Close() })
	_, err = dialSocket(ctx, "unix", dropping, time.Second)
	wantBusy(t, err, "closed the connection")

	refusing := listenUnix(t, nil)
	_, err = dialSocket(ctx, "unix", refusing, time.Second)
	wantBusy(t, err, "is swtpm (or steward-tpm-relay) running")
}

func TestOpenErrorBusy(t *testing.T) {
	// /dev/tpm0 answers a second open with EBUSY; there is no TPM device
	// here, so the error os.OpenFile returns is given to openError.
	err := openError(RawDevice, &fs.PathError{Op: "open", Path: RawDevice, Err: syscall.EBUSY})
	if !errors.Is(err, syscall.EBUSY) || !strings.Contains(err.Error(), "device="+ResourceManagerDevice) {
		t.Fatal(err)
	}
	wantBusy(t, err, "device or resource busy")
	if err := openError(RawDevice, fs.ErrPermission); strings.Contains(err.Error(), "another process") {
		t.Fatalf("permission error with the busy hint: %v", err)
	}
}

func wantBusy(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "another process may hold the TPM connection") {
		t.Fatalf("err = %v, want %q and the busy hint", err, want)
	}
}

// listenUnix serves a unix socket with handle; a nil handle leaves the
// socket file without a listener, so connecting is refused.
func listenUnix(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tpm.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	if handle == nil {
		ln.SetUnlinkOnClose(false)
		ln.Close()
		return path
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			handle(c)
		}
	}()
	return path
}
