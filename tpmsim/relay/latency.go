package relay

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-tpm/tpm2"
)

// commandNames are the TPM 2.0 Part 3 command names a latency may be set
// for by name, without the TPM2_ prefix; any other command by its code.
var commandNames = map[string]tpm2.TPMCC{
	"Sign":              tpm2.TPMCCSign,
	"VerifySignature":   tpm2.TPMCCVerifySignature,
	"PolicyPCR":         tpm2.TPMCCPolicyPCR,
	"PolicyCommandCode": tpm2.TPMCCPolicyCommandCode,
	"PolicyRestart":     tpm2.TPMCCPolicyRestart,
	"StartAuthSession":  tpm2.TPMCCStartAuthSession,
	"CreatePrimary":     tpm2.TPMCCCreatePrimary,
	"Create":            tpm2.TPMCCCreate,
	"Load":              tpm2.TPMCCLoad,
	"ReadPublic":        tpm2.TPMCCReadPublic,
	"FlushContext":      tpm2.TPMCCFlushContext,
	"ContextSave":       tpm2.TPMCCContextSave,
	"ContextLoad":       tpm2.TPMCCContextLoad,
	"EvictControl":      tpm2.TPMCCEvictControl,
	"GetCapability":     tpm2.TPMCCGetCapability,
	"PCR_Read":          tpm2.TPMCCPCRRead,
	"PCR_Extend":        tpm2.TPMCCPCRExtend,
	"GetRandom":         tpm2.TPMCCGetRandom,
	"Hash":              tpm2.TPMCCHash,
}

// ParseLatency parses "Sign=60ms" (a Part 3 command name without TPM2_,
// or a command code such as 0x15D) into l, which it creates if nil.
func ParseLatency(l map[tpm2.TPMCC]time.Duration, spec string) (map[tpm2.TPMCC]time.Duration, error) {
	name, dur, ok := strings.Cut(spec, "=")
	if !ok {
		return nil, fmt.Errorf("latency %q: want COMMAND=DURATION, e.g. Sign=60ms", spec)
	}
	cc, err := commandCode(strings.TrimPrefix(strings.TrimSpace(name), "TPM2_"))
	if err != nil {
		return nil, err
	}
	d, err := time.ParseDuration(strings.TrimSpace(dur))
	if err != nil || d < 0 || d > time.Minute {
		return nil, fmt.Errorf("latency %q: want a duration between 0 and 1m, e.g. 60ms", spec)
	}
	if l == nil {
		l = map[tpm2.TPMCC]time.Duration{}
	}
	l[cc] = d
	return l, nil
}

func commandCode(name string) (tpm2.TPMCC, error) {
	if cc, ok := commandNames[name]; ok {
		return cc, nil
	}
	if v, err := strconv.ParseUint(name, 0, 32); err == nil && strings.HasPrefix(name, "0x") {
		return tpm2.TPMCC(v), nil
	}
	known := make([]string, 0, len(commandNames))
	for n := range commandNames {
		known = append(known, n)
	}
	sort.Strings(known)
	return 0, fmt.Errorf("unknown TPM command %q: use one of %s, or a command code such as 0x15D", name, strings.Join(known, ", "))
}

// commandName is a command's Part 3 name if known, else its code.
func commandName(cc tpm2.TPMCC) string {
	for n, c := range commandNames {
		if c == cc {
			return n
		}
	}
	return fmt.Sprintf("0x%x", uint32(cc))
}
