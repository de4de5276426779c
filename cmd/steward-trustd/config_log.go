package main

import "fmt"

// Issuance log modes (TRUSTD_LOG).
const (
	logRequired = "required"
	logOff      = "off"
)

func (c *config) logSettings() []setting {
	return []setting{
		{flag: "log", env: "TRUSTD_LOG", derived: "required when TRUSTD_LOG_DIR is set, else off", doc: "required: a certificate is sent only once the issuance log holds it (a log that cannot append makes requests Unavailable and the daemon not ready); off: no log, which must be said when TRUSTD_LOG_DIR is set", to: bind("mode", &c.logMode, logMode)},
		{flag: "log-dir", env: "TRUSTD_LOG_DIR", derived: "off", doc: "an absolute path: the issuance log's directory, with log.pub from steward-trustd-ceremony log init; served read-only at <health-addr>/log/", to: bind("path", &c.logDir, absPath)},
		{flag: "log-key", env: "TRUSTD_LOG_KEY", doc: "key URI of the log key that signs checkpoints (log init --signer): file:, tpm:, pkcs11:; never the OS CA key", to: text(&c.logKey)},
		{flag: "log-checkpoint-interval", env: "TRUSTD_LOG_CHECKPOINT_INTERVAL", def: "1s", doc: "the longest an entry waits for a signed checkpoint (one log-key signature per interval, or per 1024 entries)", to: duration(&c.logInterval)},
	}
}

func logMode(v string) (string, error) {
	if v != logRequired && v != logOff {
		return "", notOne(v, "required or off")
	}
	return v, nil
}

// checkLog defaults TRUSTD_LOG from TRUSTD_LOG_DIR and demands what a
// required log needs: its directory and a key of its own.
func checkLog(c *config) error {
	if c.logMode == "" {
		c.logMode = logOff
		if c.logDir != "" {
			c.logMode = logRequired
		}
	}
	switch {
	case c.logMode == logOff:
		return nil
	case c.logDir == "":
		return c.bad("log-dir", "TRUSTD_LOG=required needs the log directory; create it with steward-trustd-ceremony log init, or set TRUSTD_LOG=off")
	case c.logKey == "":
		return c.bad("log-key", "the issuance log needs its key URI (steward-trustd-ceremony log init --signer URI); set TRUSTD_LOG=off to run without a log")
	case c.logKey == c.signer:
		return c.bad("log-key", "%s is the OS CA key: the log key must be a key of its own", c.logKey)
	}
	return nil
}

// logDescription is the start-up line's view of the log setting.
func (c *config) logDescription() string {
	if c.logMode == logOff {
		return logOff
	}
	return fmt.Sprintf("%s in %s", c.logMode, c.logDir)
}
