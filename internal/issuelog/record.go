package issuelog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// MaxEntry bounds one entry: C2SP entry bundles frame entries with a
// 16-bit length (c2sp.org/tlog-tiles, "Log entries").
const MaxEntry = 1<<16 - 1

// recordHeader is the on-disk framing of one entry in entries.log: a
// big-endian 32-bit length and a CRC-32C of the entry, so that a record
// torn by a crash (never acknowledged: the log acknowledges after fsync)
// is recognised on open and cut off.
const recordHeader = 8

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func appendRecord(buf, entry []byte) []byte {
	var h [recordHeader]byte
	binary.BigEndian.PutUint32(h[:4], uint32(len(entry)))
	binary.BigEndian.PutUint32(h[4:], crc32.Checksum(entry, castagnoli))
	return append(append(buf, h[:]...), entry...)
}

// errTorn reports a record that does not end or does not check: the tail
// a crash left, or damage.
var errTorn = errors.New("torn or damaged record")

// readRecords reads entries.log: the entries and the offset after the
// last good record. It stops at the first bad record (errTorn).
func readRecords(data []byte) (entries [][]byte, good int64, err error) {
	off := 0
	for off < len(data) {
		if len(data)-off < recordHeader {
			return entries, int64(off), errTorn
		}
		n := int(binary.BigEndian.Uint32(data[off:]))
		sum := binary.BigEndian.Uint32(data[off+4:])
		end := off + recordHeader + n
		if n > MaxEntry || end > len(data) || crc32.Checksum(data[off+recordHeader:end], castagnoli) != sum {
			return entries, int64(off), fmt.Errorf("%w at byte %d (entry %d)", errTorn, off, len(entries))
		}
		entries = append(entries, data[off+recordHeader:end])
		off = end
	}
	return entries, int64(off), nil
}

// entryBundle is the C2SP tlog-tiles entry bundle of entries: each one
// as a big-endian 16-bit length and the entry.
func entryBundle(w io.Writer, entries [][]byte) error {
	for _, e := range entries {
		var n [2]byte
		binary.BigEndian.PutUint16(n[:], uint16(len(e)))
		if _, err := w.Write(append(n[:], e...)); err != nil {
			return err
		}
	}
	return nil
}

// parseBundle splits an entry bundle.
func parseBundle(b []byte) ([][]byte, error) {
	var out [][]byte
	for len(b) > 0 {
		if len(b) < 2 {
			return nil, errors.New("entry bundle: truncated length")
		}
		n := int(binary.BigEndian.Uint16(b))
		if len(b) < 2+n {
			return nil, errors.New("entry bundle: truncated entry")
		}
		out = append(out, b[2:2+n])
		b = b[2+n:]
	}
	return out, nil
}
