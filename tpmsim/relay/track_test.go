package relay

import (
	"encoding/binary"
	"testing"

	"github.com/google/go-tpm/tpm2"
)

// FuzzTrack: no command and response pair makes ownership checks or
// tracking panic, only transient objects and sessions are ever tracked,
// and a client's handle listing holds only its own handles.
func FuzzTrack(f *testing.F) {
	ok := []byte{0x80, 0x01, 0, 0, 0, 14, 0, 0, 0, 0, 0x80, 0, 0, 1}
	f.Add(flushCommand(0x80000001), ok, int8(-1))
	f.Add([]byte{0x80, 0x01, 0, 0, 0, 10, 0, 0, 1, 0x31}, ok, int8(1))
	f.Add(signWithSession(0x80000001, 0x03000000, 0), ok, int8(1))
	f.Add(commandsQuery(0x11F), []byte{0x80, 0x01, 0, 0, 0, 10, 0, 0, 0, 0}, int8(0))
	f.Fuzz(func(t *testing.T, cmd, rsp []byte, nh int8) {
		cl := &client{objects: map[tpm2.TPMHandle]struct{}{0x80000002: {}, 0x02000001: {}}}
		cl.foreign(cmd, int(nh))
		cl.track(CommandCode(cmd), cmd, rsp, int(nh))
		for h := range cl.objects {
			if !ownable(uint32(h)) {
				t.Fatalf("tracked a shared handle 0x%08x", uint32(h))
			}
		}
		if property, count, ok := handlesQuery(cmd); ok {
			checkListing(t, cl, cl.ownHandles(property, count))
		}
		(handleCounts{}).parseCommands(rsp)
	})
}

// checkListing: every handle in a TPM_CAP_HANDLES answer is the client's.
func checkListing(t *testing.T, cl *client, rsp []byte) {
	t.Helper()
	n := binary.BigEndian.Uint32(rsp[15:19])
	for i := range n {
		if h := binary.BigEndian.Uint32(rsp[19+4*i:]); !cl.owns(h) {
			t.Fatalf("listed 0x%08x, not the client's", h)
		}
	}
}

// signWithSession is a TPM_ST_SESSIONS command with one handle and one
// session whose continueSession bit is attrs&1.
func signWithSession(key, sess uint32, attrs byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(tpm2.TPMSTSessions))
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(tpm2.TPMCCSign))
	b = binary.BigEndian.AppendUint32(b, key)
	b = binary.BigEndian.AppendUint32(b, 9)
	b = binary.BigEndian.AppendUint32(b, sess)
	b = append(b, 0, 0, attrs, 0, 0)
	binary.BigEndian.PutUint32(b[2:], uint32(len(b)))
	return b
}

func TestForeignHandles(t *testing.T) {
	cl := &client{objects: map[tpm2.TPMHandle]struct{}{0x80000001: {}, 0x03000000: {}}}
	cases := []struct {
		name string
		cmd  []byte
		nh   int
		want uint32
	}{
		{"flush own object", flushCommand(0x80000001), -1, 0},
		{"flush another's object", flushCommand(0x80000002), -1, 0x1CB},
		{"flush another's session", flushCommand(0x02000000), -1, 0x1CB},
		{"flush a persistent handle", flushCommand(0x81000001), -1, 0},
		{"sign with own key and session", signWithSession(0x80000001, 0x03000000, 1), 1, 0},
		{"sign with another's key", signWithSession(0x80000002, 0x03000000, 1), 1, 0x18B},
		{"sign with another's session", signWithSession(0x80000001, 0x03000001, 1), 1, 0x98B},
		{"password session", signWithSession(0x80000001, 0x40000009, 1), 1, 0},
		{"handle count unknown", signWithSession(0x80000002, 0x03000001, 1), -1, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := cl.foreign(tc.cmd, tc.nh); got != tc.want {
				t.Fatalf("0x%x, want 0x%x", got, tc.want)
			}
		})
	}
	ok := []byte{0x80, 0x01, 0, 0, 0, 10, 0, 0, 0, 0}
	cl.track(tpm2.TPMCCSign, signWithSession(0x80000001, 0x03000000, 0), ok, 1)
	if cl.owns(0x03000000) || !cl.owns(0x80000001) {
		t.Fatal("a session used without continueSession is still tracked, or the key was dropped")
	}
}
