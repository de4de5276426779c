package tpmdev

import (
	"context"
	"path/filepath"
	"strings"
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
