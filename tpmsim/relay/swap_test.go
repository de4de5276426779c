package relay

import (
	"encoding/binary"
	"testing"

	"github.com/google/go-tpm/tpm2"
)

// TestNewHandleNeverReusesAClientHandle: the TPM may hand a client a
// number the client already uses for a moved object, even the lowest
// transient handle; the client then gets another, free number, and the
// moved object keeps its own (otherwise naming it would load the old
// object and orphan the new one in the TPM).
func TestNewHandleNeverReusesAClientHandle(t *testing.T) {
	cases := []struct {
		name  string
		owned []tpm2.TPMHandle
		got   uint32
	}{
		{"above a moved object", []tpm2.TPMHandle{0x80000001}, 0x80000001},
		{"the lowest number", []tpm2.TPMHandle{0x80000000}, 0x80000000},
		{"every low number", []tpm2.TPMHandle{0x80000000, 0x80000001, 0x80000002}, 0x80000001},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cl := &client{objects: map[tpm2.TPMHandle]struct{}{}, saved: map[tpm2.TPMHandle][]byte{}}
			for _, h := range tc.owned {
				cl.objects[h], cl.saved[h] = struct{}{}, []byte("context")
			}
			rsp := binary.BigEndian.AppendUint32(make([]byte, 10), tc.got)
			v := cl.newHandle(rsp, tc.got)
			if _, clash := cl.saved[v]; clash || uint32(v)>>24 != htTransient {
				t.Fatalf("new object got handle 0x%08x, which the client already uses (or not transient)", uint32(v))
			}
			if got := binary.BigEndian.Uint32(rsp[10:14]); got != uint32(v) || cl.realHandle(uint32(v)) != tc.got {
				t.Fatalf("response carries 0x%08x, real 0x%08x; want 0x%08x for real 0x%08x", got, cl.realHandle(uint32(v)), uint32(v), tc.got)
			}
			if len(cl.objects) != len(tc.owned)+1 {
				t.Fatalf("%d handles tracked, want %d", len(cl.objects), len(tc.owned)+1)
			}
		})
	}
}
