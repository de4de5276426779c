package tpm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/google/go-tpm/tpm2/transport"
)

// maxResponse bounds a TPM response read from a stream. TPM responses are
// at most MAX_RESPONSE_SIZE (4096 on PC Client TPMs); swtpm's libtpms uses
// up to 4096 too. A larger size in the header means the stream is corrupt.
const maxResponse = 1 << 16

// ErrBadFrame reports a TPM response header whose size is impossible.
var ErrBadFrame = errors.New("tpm stream: bad response size")

// NewStreamTransport wraps a byte stream that carries raw TPM 2.0 commands
// and responses back to back (a swtpm --server socket, TCP or unix) as a
// go-tpm transport. Each response is read in full: the 10-byte header
// (tag, size, responseCode; TPM 2.0 Part 1 §18) gives the total size, the
// rest is read with io.ReadFull, so a response split across reads is never
// truncated. It does not open anything: the caller dials and hands over
// the connection, which Close closes.
func NewStreamTransport(conn io.ReadWriteCloser) transport.TPMCloser {
	return &streamTPM{conn: conn}
}

type streamTPM struct {
	mu   sync.Mutex
	conn io.ReadWriteCloser
}

// Send implements transport.TPM.
func (s *streamTPM) Send(cmd []byte) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.conn.Write(cmd); err != nil {
		return nil, fmt.Errorf("tpm stream: write command: %w", err)
	}
	var hdr [10]byte
	if _, err := io.ReadFull(s.conn, hdr[:]); err != nil {
		return nil, fmt.Errorf("tpm stream: read response header: %w", err)
	}
	size := binary.BigEndian.Uint32(hdr[2:6])
	if size < uint32(len(hdr)) || size > maxResponse {
		return nil, fmt.Errorf("%w: %d", ErrBadFrame, size)
	}
	rsp := make([]byte, size)
	copy(rsp, hdr[:])
	if _, err := io.ReadFull(s.conn, rsp[len(hdr):]); err != nil {
		return nil, fmt.Errorf("tpm stream: read response body: %w", err)
	}
	return rsp, nil
}

// Close implements io.Closer.
func (s *streamTPM) Close() error { return s.conn.Close() }
