package relay_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/tpmsim"
	"github.com/steward-trustd/steward-trustd/tpmsim/relay"
)

// fakeTPM answers every command with success; CreatePrimary returns
// transient handle 0x80000001. It records the command codes it saw.
type fakeTPM struct {
	mu   sync.Mutex
	seen []tpm2.TPMCC
}

func (f *fakeTPM) dial(context.Context) (net.Conn, error) {
	a, b := net.Pipe()
	go f.serve(b)
	return a, nil
}

func (f *fakeTPM) serve(c net.Conn) {
	defer c.Close()
	for {
		cmd, err := relay.ReadFrame(c)
		if err != nil {
			return
		}
		cc := relay.CommandCode(cmd)
		f.mu.Lock()
		f.seen = append(f.seen, cc)
		f.mu.Unlock()
		rsp := make([]byte, 10, 14)
		if cc == tpm2.TPMCCCreatePrimary {
			rsp = binary.BigEndian.AppendUint32(rsp, 0x80000001)
		}
		binary.BigEndian.PutUint16(rsp, uint16(tpm2.TPMSTNoSessions))
		binary.BigEndian.PutUint32(rsp[2:], uint32(len(rsp)))
		c.Write(rsp)
	}
}

// commands lists the clients' commands the TPM saw, without the
// relay's own TPM2_GetCapability(TPM_CAP_COMMANDS).
func (f *fakeTPM) commands() []tpm2.TPMCC {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []tpm2.TPMCC
	for _, cc := range f.seen {
		if cc != tpm2.TPMCCGetCapability {
			out = append(out, cc)
		}
	}
	return out
}

func command(cc tpm2.TPMCC, handle uint32) []byte {
	b := make([]byte, 14)
	binary.BigEndian.PutUint16(b, uint16(tpm2.TPMSTNoSessions))
	binary.BigEndian.PutUint32(b[2:], 14)
	binary.BigEndian.PutUint32(b[6:], uint32(cc))
	binary.BigEndian.PutUint32(b[10:], handle)
	return b
}

// startRelay serves r on a unix socket and returns a dialer for clients.
func startRelay(t *testing.T, opts relay.Options) func() net.Conn {
	t.Helper()
	r, err := relay.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", t.TempDir()+"/relay.sock")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Serve(ln) }()
	t.Cleanup(func() {
		ln.Close()
		if err := <-done; err != nil {
			t.Error(err)
		}
		r.Close()
	})
	return func() net.Conn {
		c, err := net.Dial("unix", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

func roundTrip(t *testing.T, c net.Conn, cmd []byte) []byte {
	t.Helper()
	if _, err := c.Write(cmd); err != nil {
		t.Fatal(err)
	}
	rsp, err := relay.ReadFrame(c)
	if err != nil {
		t.Fatal(err)
	}
	return rsp
}

// TestLatencyHoldsTheTPM: a slow command delays the next client's command
// too, as a busy chip would.
func TestLatencyHoldsTheTPM(t *testing.T) {
	f := &fakeTPM{}
	const sign = 40 * time.Millisecond
	dial := startRelay(t, relay.Options{Upstream: f.dial, Latency: map[tpm2.TPMCC]time.Duration{tpm2.TPMCCSign: sign}})
	a, b := dial(), dial()
	defer a.Close()
	defer b.Close()
	start := time.Now()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); roundTrip(t, a, command(tpm2.TPMCCSign, 0)) }()
	go func() { defer wg.Done(); roundTrip(t, b, command(tpm2.TPMCCSign, 0)) }()
	wg.Wait()
	if took := time.Since(start); took < 2*sign {
		t.Fatalf("two signatures took %v, less than 2 × %v: the latency does not hold the TPM", took, sign)
	}
	start = time.Now()
	roundTrip(t, a, command(tpm2.TPMCCGetRandom, 0))
	if took := time.Since(start); took >= sign {
		t.Fatalf("GetRandom took %v: latency applied to a command without one", took)
	}
}

// TestDepartedClientObjectsFlushed: objects a client loaded and did not
// flush are flushed when it disconnects; flushed ones are not flushed twice.
func TestDepartedClientObjectsFlushed(t *testing.T) {
	cases := []struct {
		name      string
		flushSelf bool
		want      []tpm2.TPMCC
	}{
		{"leaves an object", false, []tpm2.TPMCC{tpm2.TPMCCCreatePrimary, tpm2.TPMCCFlushContext}},
		{"flushes its own", true, []tpm2.TPMCC{tpm2.TPMCCCreatePrimary, tpm2.TPMCCFlushContext}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeTPM{}
			dial := startRelay(t, relay.Options{Upstream: f.dial, KeepUpstream: true})
			cl := dial()
			roundTrip(t, cl, command(tpm2.TPMCCCreatePrimary, uint32(tpm2.TPMRHOwner)))
			if c.flushSelf {
				roundTrip(t, cl, command(tpm2.TPMCCFlushContext, 0x80000001))
			}
			cl.Close()
			deadline := time.Now().Add(5 * time.Second)
			for len(f.commands()) < len(c.want) && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond) // a second flush would show now
			got := f.commands()
			if len(got) != len(c.want) || got[0] != c.want[0] || got[1] != c.want[1] {
				t.Fatalf("TPM saw %v, want %v", got, c.want)
			}
		})
	}
}

func TestParseLatency(t *testing.T) {
	cases := []struct {
		spec    string
		cc      tpm2.TPMCC
		d       time.Duration
		wantErr string
	}{
		{"Sign=60ms", tpm2.TPMCCSign, 60 * time.Millisecond, ""},
		{"TPM2_PolicyPCR=5ms", tpm2.TPMCCPolicyPCR, 5 * time.Millisecond, ""},
		{"0x15D=1s", tpm2.TPMCCSign, time.Second, ""},
		{"Sign", 0, 0, "COMMAND=DURATION"},
		{"Frobnicate=1ms", 0, 0, "unknown TPM command"},
		{"Sign=-1ms", 0, 0, "between 0 and 1m"},
		{"Sign=2h", 0, 0, "between 0 and 1m"},
	}
	for _, c := range cases {
		t.Run(c.spec, func(t *testing.T) {
			l, err := relay.ParseLatency(nil, c.spec)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || l[c.cc] != c.d {
				t.Fatalf("got %v, %v; want %v for 0x%x", l, err, c.d, uint32(c.cc))
			}
		})
	}
}

func TestReadFrameRejectsBadSize(t *testing.T) {
	for _, size := range []uint32{9, 1 << 20} {
		hdr := make([]byte, 10)
		binary.BigEndian.PutUint32(hdr[2:], size)
		if _, err := relay.ReadFrame(strings.NewReader(string(hdr))); err == nil || errors.Is(err, io.EOF) {
			t.Fatalf("size %d: %v, want a size error", size, err)
		}
	}
}

// TestTwoProcessesShareSwtpm: two clients use one swtpm through the relay
// at the same time, and a client that vanishes leaves no object behind.
func TestTwoProcessesShareSwtpm(t *testing.T) {
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := sw.Dial(ctx, sw.Device())
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			for j := 0; j < 20; j++ {
				if _, err := (tpm2.GetRandom{BytesRequested: 16}).Execute(c); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	leaveObject(t, sw)
	deadline := time.Now().Add(5 * time.Second)
	for {
		hs, err := sw.LoadedHandles()
		if err != nil {
			t.Fatal(err)
		}
		if len(hs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("departed client's objects still loaded: %v", hs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// leaveObject connects, loads a primary key and disconnects without
// flushing it, as a crashed process would.
func leaveObject(t *testing.T, sw *tpmsim.Swtpm) {
	t.Helper()
	c, err := sw.Dial(context.Background(), sw.Device())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// swtpm keeps transient objects across connections: only the relay's
	// flush frees this one.
	if _, err := (tpm2.CreatePrimary{
		PrimaryHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
		InPublic:      tpm2.New2B(tpm2.ECCSRKTemplate),
	}).Execute(c); err != nil {
		t.Fatal(err)
	}
}

// FuzzFrames: no frame a client sends makes the relay's parsing or
// object tracking panic.
func FuzzFrames(f *testing.F) {
	f.Add(command(tpm2.TPMCCCreatePrimary, 0x40000001))
	f.Add(command(tpm2.TPMCCFlushContext, 0x80000001))
	f.Add([]byte{0x80, 0x01, 0, 0, 0, 9})
	f.Fuzz(func(t *testing.T, b []byte) {
		frame, err := relay.ReadFrame(strings.NewReader(string(b)))
		if err != nil {
			return
		}
		relay.CommandCode(frame)
		relay.ResponseCode(frame)
	})
}
