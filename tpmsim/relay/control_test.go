package relay_test

import (
	"bytes"
	"encoding/binary"
	"testing"

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
