package server

import (
	"net"
	"testing"
	"time"
)

// fakeConn is a connection from a given address; it records Close.
type fakeConn struct {
	net.Conn
	from   *net.TCPAddr
	closed bool
}

func (c *fakeConn) RemoteAddr() net.Addr { return c.from }
func (c *fakeConn) Close() error         { c.closed = true; return nil }

func TestEvictionPicksTheBusiestAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	l := newConnListener(ln, ConnLimits{MaxConnections: 10, MaxUnauthenticated: 3, HandshakeTimeout: time.Minute}, nil, nil)
	conn := func(ip string, port int) *fakeConn {
		return &fakeConn{from: &net.TCPAddr{IP: net.ParseIP(ip), Port: port}}
	}
	steps := []struct {
		name   string
		c      *fakeConn
		evicts int // index into admitted, -1 for none
	}{
		{"worker, the oldest", conn("10.0.0.1", 1), -1},
		{"attacker 1", conn("10.0.0.2", 1), -1},
		{"attacker 2", conn("10.0.0.2", 2), -1},
		// Full: the busiest address loses its oldest, not the worker.
		{"attacker 3", conn("10.0.0.2", 3), 1},
		{"attacker 4", conn("10.0.0.2", 4), 2},
		{"second worker", conn("10.0.0.3", 1), 3},
		// Every address holds one now: the oldest overall goes.
		{"third worker", conn("10.0.0.4", 1), 0},
	}
	var admitted []*fakeConn
	evicted := map[int]bool{}
	for _, s := range steps {
		if l.admit(s.c) == nil {
			t.Fatalf("%s: refused", s.name)
		}
		admitted = append(admitted, s.c)
		if s.evicts >= 0 {
			evicted[s.evicts] = true
		}
		for i, c := range admitted {
			if c.closed != evicted[i] {
				t.Fatalf("after %s: connection %d closed=%v, want %v", s.name, i, c.closed, evicted[i])
			}
		}
	}
}
