package tpm

import (
	"path/filepath"
	"strconv"
	"strings"
)

// MaxConnections bounds connections=: each connection keeps the key
// loaded (one transient object) and one policy session, and two are
// enough to keep the device busy — the next request's policy commands
// queue at the device while the current TPM2_Sign runs — so a third
// would only take object and session slots from other TPM users.
const MaxConnections = 2

// parseConnections parses connections=N for device d (1 or 2).
func parseConnections(v string, d Device) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxConnections || strconv.Itoa(n) != v {
		return 0, uriErr("connections %q: want 1 or %d", v, MaxConnections)
	}
	if n > 1 && !d.multiplexed() {
		return 0, uriErr("connections=%d needs a TPM that serves several clients: device=/dev/tpmrm0 (the kernel resource manager), or a socket= / swtpm= address of a resource manager such as steward-tpm-relay; %s serves one", n, d)
	}
	return n, nil
}

// defaultConnections is the connection count of a URI without
// connections=: two behind the kernel resource manager, which serves
// several clients, one elsewhere (a raw device or a swtpm socket serves a
// single client; a socket of a resource manager such as steward-tpm-relay
// must say connections=2).
func defaultConnections(d Device) int {
	if d.Kind == DeviceChar && isResourceManager(d.Addr) {
		return 2
	}
	return 1
}

// multiplexed reports whether d may be a TPM serving several clients at
// once: the kernel resource manager, or a socket (which may be a resource
// manager; a bare swtpm socket is not, and the URI's author says which).
// DeviceAuto may resolve to the raw /dev/tpm0, which serves one.
func (d Device) multiplexed() bool {
	switch d.Kind {
	case DeviceTCP, DeviceUnix:
		return true
	case DeviceChar:
		return isResourceManager(d.Addr)
	}
	return false
}

func isResourceManager(path string) bool {
	return strings.HasPrefix(filepath.Base(path), "tpmrm")
}
