package server

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// deferAccept asks the kernel to hand over a connection only once it has
// sent data, or d has passed (TCP_DEFER_ACCEPT, tcp(7)): a socket that
// connects and stays silent then never takes a slot.
func deferAccept(l net.Listener, d time.Duration) error {
	sc, ok := l.(syscall.Conn)
	if !ok {
		return errors.New("not a TCP listener")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	secs := max(int(d.Round(time.Second)/time.Second), 1)
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_DEFER_ACCEPT, secs)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("TCP_DEFER_ACCEPT: %w", serr)
	}
	return nil
}

// silentConn reports whether c has no data to read yet (a peek, which
// never blocks and consumes nothing). A connection handed over by a
// deferring listener without data has waited out the deferral silent.
func silentConn(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, rerr = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true
	})
	// EAGAIN: nothing yet. An error or EOF (n == 0, no error: the peer
	// closed) is for the reader to find; such a connection is not silent
	// in this sense.
	return err == nil && errors.Is(rerr, syscall.EAGAIN)
}
