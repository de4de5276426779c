package relay

import (
	"testing"

	"github.com/google/go-tpm/tpm2"
)

// FuzzTrack: no command and response pair makes object tracking panic,
// and only transient handles are ever tracked.
func FuzzTrack(f *testing.F) {
	ok := []byte{0x80, 0x01, 0, 0, 0, 14, 0, 0, 0, 0, 0x80, 0, 0, 1}
	f.Add(flushCommand(0x80000001), ok)
	f.Add([]byte{0x80, 0x01, 0, 0, 0, 10, 0, 0, 1, 0x31}, ok)
	f.Fuzz(func(t *testing.T, cmd, rsp []byte) {
		cl := &client{objects: map[tpm2.TPMHandle]struct{}{}}
		cl.track(CommandCode(cmd), cmd, rsp)
		for h := range cl.objects {
			if h < transientFirst {
				t.Fatalf("tracked non-transient handle 0x%08x", uint32(h))
			}
		}
	})
}
