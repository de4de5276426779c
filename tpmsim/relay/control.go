package relay

// swtpm's control channel (the "Control Channel Specification" of the
// swtpm wiki, swtpm's tpm_ioctl.h): a 4-byte big-endian command code and
// its parameters; the answer is a 4-byte result code (TPM 1.2 result
// codes) and data, except CMD_GET_CAPABILITY, which answers 8 bytes of
// capability flags. tpm2-tss's swtpm TCTI (TPM2TOOLS_TCTI=swtpm:host=H,
// port=P) sends CMD_SET_LOCALITY 0 on port P+1 when it starts. The relay
// answers the harmless commands itself and refuses every command that
// would power-cycle, stop, reset or replace the TPM under the other
// clients, or read its state (which holds its secrets).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// Control channel command codes (swtpm tpm_ioctl.h).
const (
	ctrlGetCapability = 0x01
	ctrlSetLocality   = 0x05
	ctrlCancelTPMCmd  = 0x09
)

// Control channel result codes (TPM 1.2 TPM_RESULT values swtpm uses).
const (
	resSuccess      = 0x00
	resBadParameter = 0x03
	resFail         = 0x09
	resBadOrdinal   = 0x0A
	resBadLocality  = 0x3D
)

// Capability flags (tpm_ioctl.h PTM_CAP_*) of what the relay answers.
const (
	capSetLocality  = 1 << 3
	capCancelTPMCmd = 1 << 5
)

// ctrlNames names the commands the relay refuses, for its log line.
var ctrlNames = map[uint32]string{
	0x02: "CMD_INIT", 0x03: "CMD_SHUTDOWN", 0x04: "CMD_GET_TPMESTABLISHED", 0x06: "CMD_HASH_START",
	0x07: "CMD_HASH_DATA", 0x08: "CMD_HASH_END", 0x0a: "CMD_STORE_VOLATILE", 0x0b: "CMD_RESET_TPMESTABLISHED",
	0x0c: "CMD_GET_STATEBLOB", 0x0d: "CMD_SET_STATEBLOB", 0x0e: "CMD_STOP", 0x0f: "CMD_GET_CONFIG",
	0x10: "CMD_SET_DATAFD", 0x11: "CMD_SET_BUFFERSIZE", 0x12: "CMD_GET_INFO", 0x13: "CMD_LOCK_STORAGE",
}

// maxControl bounds a control request (swtpm reads at most 4096 bytes).
const maxControl = 4096

// ControlAnswer is the relay's answer to one control request: the bytes
// to send back, and a reason when it refused the request.
func ControlAnswer(req []byte) (rsp []byte, refused string) {
	if len(req) < 4 {
		return result(resBadParameter), "a request shorter than its command code"
	}
	cmd, body := binary.BigEndian.Uint32(req[:4]), req[4:]
	switch cmd {
	case ctrlGetCapability:
		return binary.BigEndian.AppendUint64(nil, capSetLocality|capCancelTPMCmd), ""
	case ctrlSetLocality:
		if len(body) != 1 {
			return result(resBadParameter), "CMD_SET_LOCALITY without its one-byte locality"
		}
		if body[0] != 0 {
			return result(resBadLocality), fmt.Sprintf("CMD_SET_LOCALITY %d: the TPM is shared, clients stay at locality 0", body[0])
		}
		return result(resSuccess), ""
	case ctrlCancelTPMCmd:
		return result(resFail), "" // as swtpm: commands cannot be cancelled
	}
	if name, ok := ctrlNames[cmd]; ok {
		return result(resFail), name + " would reset, stop or expose the TPM under the relay's other clients"
	}
	return result(resBadOrdinal), fmt.Sprintf("unknown control command 0x%x", cmd)
}

func result(code uint32) []byte { return binary.BigEndian.AppendUint32(nil, code) }

// maxControlClients bounds the control connections served at once (the
// swtpm TCTI opens one per control command and closes it).
const maxControlClients = 16

// ServeControl answers swtpm control-channel clients on ln until ln is
// closed; see ControlAnswer. Beyond maxControlClients at once a
// connection is closed unanswered.
func (r *Relay) ServeControl(ln net.Listener) error {
	slots := make(chan struct{}, maxControlClients)
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("relay: accept a control client: %w", err)
		}
		select {
		case slots <- struct{}{}:
			go func() { defer func() { <-slots }(); r.serveControl(c) }()
		default:
			r.log.Warn("TPM relay: too many control connections; closing one", "limit", maxControlClients)
			c.Close()
		}
	}
}

// serveControl answers one control connection's requests, one read each
// (as swtpm does), until it closes or idles for a minute.
func (r *Relay) serveControl(c net.Conn) {
	defer c.Close()
	buf := make([]byte, maxControl)
	for {
		c.SetDeadline(time.Now().Add(time.Minute))
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		rsp, refused := ControlAnswer(buf[:n])
		if refused != "" {
			r.log.Warn("TPM relay: refused a control command", "reason", refused)
		}
		if _, err := c.Write(rsp); err != nil {
			return
		}
	}
}

// ErrNotLoopback refuses a tpm2-tools address that is not loopback: a
// TPM must not be reachable from the network.
var ErrNotLoopback = errors.New("want a loopback HOST:PORT such as 127.0.0.1:2321 (a TPM must not be reachable from the network)")

// ListenTCTI listens where tpm2-tss's swtpm TCTI connects: a loopback
// PORT (commands, for Serve) and PORT+1 (control, for ServeControl).
// Port 0 tries a few free pairs.
func ListenTCTI(addr string) (data, ctrl net.Listener, err error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().IsLoopback() {
		return nil, nil, ErrNotLoopback
	}
	for range 20 {
		if data, err = net.Listen("tcp", addr); err != nil {
			return nil, nil, err
		}
		port := data.Addr().(*net.TCPAddr).Port
		if ctrl, err = net.Listen("tcp", netip.AddrPortFrom(ap.Addr(), uint16(port+1)).String()); err == nil {
			return data, ctrl, nil
		}
		data.Close()
		if ap.Port() != 0 {
			return nil, nil, fmt.Errorf("control channel port %d: %w", port+1, err)
		}
	}
	return nil, nil, errors.New("found no free pair of ports PORT, PORT+1")
}
