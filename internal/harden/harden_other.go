//go:build !linux

package harden

import "errors"

var errUnsupported = errors.New("not supported on this platform (Linux only)")

func process() (Status, error) { return Status{Dumpable: -1}, errUnsupported }

func lock([]byte) error { return errUnsupported }

func unlock([]byte) {}
