package relay_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/tpmsim/relay"
)

func ctrl(cmd uint32, body ...byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, cmd), body...)
}

func TestControlAnswer(t *testing.T) {
	cases := []struct {
		name    string
		req     []byte
		want    []byte
		refused bool
	}{
		{"capabilities: set locality and cancel", ctrl(0x01), []byte{0, 0, 0, 0, 0, 0, 0, 0x28}, false},
		{"locality 0, as the swtpm TCTI sends at start", ctrl(0x05, 0), []byte{0, 0, 0, 0}, false},
		{"locality 3 would change other clients' locality", ctrl(0x05, 3), []byte{0, 0, 0, 0x3D}, true},
		{"locality without its byte", ctrl(0x05), []byte{0, 0, 0, 3}, true},
		{"cancel: not possible, as on swtpm", ctrl(0x09), []byte{0, 0, 0, 9}, false},
		{"CMD_INIT resets the TPM", ctrl(0x02, 0, 0, 0, 1), []byte{0, 0, 0, 9}, true},
		{"CMD_SHUTDOWN stops swtpm", ctrl(0x03), []byte{0, 0, 0, 9}, true},
		{"CMD_STOP", ctrl(0x0e), []byte{0, 0, 0, 9}, true},
		{"CMD_GET_STATEBLOB exports secrets", ctrl(0x0c, 0, 0, 0, 0, 0, 0, 0, 1), []byte{0, 0, 0, 9}, true},
		{"CMD_SET_STATEBLOB replaces the TPM", ctrl(0x0d), []byte{0, 0, 0, 9}, true},
		{"CMD_HASH_START resets PCRs 17-22", ctrl(0x06), []byte{0, 0, 0, 9}, true},
		{"unknown", ctrl(0x99), []byte{0, 0, 0, 0x0A}, true},
		{"short", []byte{0, 1}, []byte{0, 0, 0, 3}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, refused := relay.ControlAnswer(tc.req)
			if !bytes.Equal(got, tc.want) || (refused != "") != tc.refused {
				t.Fatalf("got %x refused %q, want %x refused=%v", got, refused, tc.want, tc.refused)
			}
		})
	}
}

// FuzzControlAnswer: no control request panics the relay, every answer
// is a 4-byte result (or GET_CAPABILITY's 8 bytes), and only
// SET_LOCALITY 0 succeeds.
func FuzzControlAnswer(f *testing.F) {
	f.Add(ctrl(0x05, 0))
	f.Add(ctrl(0x02, 0, 0, 0, 1))
	f.Add(ctrl(0x01))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, req []byte) {
		rsp, _ := relay.ControlAnswer(req)
		if len(req) >= 4 && binary.BigEndian.Uint32(req) == 0x01 {
			if len(rsp) != 8 {
				t.Fatalf("capabilities answer of %d bytes", len(rsp))
			}
			return
		}
		if len(rsp) != 4 {
			t.Fatalf("answer of %d bytes", len(rsp))
		}
		if binary.BigEndian.Uint32(rsp) == 0 && !bytes.Equal(req, ctrl(0x05, 0)) {
			t.Fatalf("request %x succeeded", req)
		}
	})
}

// TestControlConnectionsBounded: beyond 16 control connections at once
// the next is closed unanswered; the others are still served.
func TestControlConnectionsBounded(t *testing.T) {
	r, err := relay.New(relay.Options{Upstream: (&fakeTPM{}).dial})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go r.ServeControl(ln)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 17 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	extra := conns[16]
	extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := extra.Read(make([]byte, 4)); !errors.Is(err, io.EOF) {
		t.Fatalf("the 17th control connection: %v, want closed", err)
	}
	first := conns[0]
	first.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := first.Write(ctrl(0x05, 0)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(first, got); err != nil || !bytes.Equal(got, []byte{0, 0, 0, 0}) {
		t.Fatalf("a served connection: %x %v", got, err)
	}
}
