//go:build !linux

package server

import (
	"errors"
	"net"
	"time"
)

// deferAccept is Linux's TCP_DEFER_ACCEPT; elsewhere every connection is
// handed over at once and ranks as silent until it proves otherwise.
func deferAccept(net.Listener, time.Duration) error {
	return errors.New("TCP_DEFER_ACCEPT needs Linux")
}

func silentConn(net.Conn) bool { return false }
