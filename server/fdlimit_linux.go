package server

import (
	"log/slog"
	"syscall"
)

// fdHeadroom is the file descriptors kept beyond TRUSTD_MAX_CONNECTIONS:
// the health port, the signer's device, the cert dir and the logs must
// keep working when every connection slot is taken.
const fdHeadroom = 256

// checkFileLimit raises the soft open-file limit (RLIMIT_NOFILE) to what
// maxConns needs, within the hard limit, and warns when the hard limit is
// too low: accepting would then fail (EMFILE) before the cap is reached.
func checkFileLimit(maxConns int, log *slog.Logger) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return
	}
	need := uint64(maxConns + fdHeadroom)
	if lim.Cur >= need {
		return
	}
	lim.Cur = min(need, lim.Max)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < need {
		log.Warn("the open-file limit is below TRUSTD_MAX_CONNECTIONS plus headroom: raise LimitNOFILE (or the container's nofile limit), or lower TRUSTD_MAX_CONNECTIONS",
			"limit", lim.Cur, "needed", need)
	}
}
