package main

import (
	"encoding/base64"
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/server"

	"github.com/steward-trustd/steward-trustd/signer/file"
)

// setting is one configuration value: a flag and its environment variable.
type setting struct {
	flag   string
	env    string
	usage  string
	secret bool
}

// settings lists every configuration value; a function, so the table
// cannot be mutated.
func settings() []setting {
	return []setting{
		{"port", "TRUSTD_PORT", "TCP port of the SecurityService (Talos workers always dial 50001)", false},
		{"listen-address", "TRUSTD_LISTEN_ADDRESS", "IP address to listen on (default: all addresses)", false},
		{"tenant", "TRUSTD_TENANT", "tenant (cluster) name recorded in logs and audit lines", false},
		{"token", "TRUSTD_TOKEN", "worker token (machine.token); prefer the token file in the cert dir", true},
		{"os-ca-crt", "TRUSTD_OS_CA_CRT", "base64 PEM of the OS CA certificate (default: <cert-dir>/os-ca.crt)", false},
		{"os-ca-key", "TRUSTD_OS_CA_KEY", "base64 PEM of the OS CA key, held in memory (file signer only; prefer --signer)", true},
		{"server-crt", "TRUSTD_SERVER_CRT", "base64 PEM of the serving certificate (default: <cert-dir>/server.crt, else self-issued)", false},
		{"server-key", "TRUSTD_SERVER_KEY", "base64 PEM of the serving key (default: <cert-dir>/server.key)", true},
		{"cert-dir", "TRUSTD_CERT_DIR", "directory with os-ca.crt, os-ca.key, server.crt, server.key, token, accepted-cas.crt", false},
		{"signer", "TRUSTD_SIGNER", "OS CA key URI: file:/path, tpm:..., pkcs11:... (default: file:<cert-dir>/os-ca.key)", false},
		{"cert-sans", "TRUSTD_CERT_SANS", "comma-separated extra IPs/DNS names for the self-issued serving certificate", false},
		{"allowed-san-cidrs", "TRUSTD_ALLOWED_SAN_CIDRS", "comma-separated CIDRs; every IP SAN requested must fall inside one (default: no restriction)", false},
		{"require-peer-ip", "TRUSTD_REQUIRE_PEER_IP", "require the caller's address to be one of the requested IP SANs (true/false)", false},
		{"debug", "TRUSTD_DEBUG", "debug logging (true/false)", false},
		{"health-addr", "TRUSTD_HEALTH_ADDR", "plaintext address for /healthz, /readyz, /metrics and gRPC health, e.g. :50002 (default: off)", false},
		{"peer-rate", "TRUSTD_PEER_RATE", "requests per second allowed from one address, -1 for no limit (default 1)", false},
		{"peer-burst", "TRUSTD_PEER_BURST", "burst of requests allowed from one address (default 20)", false},
		{"bad-token-burst", "TRUSTD_BAD_TOKEN_BURST", "wrong tokens one address may send before it is slowed down (default 5)", false},
		{"bad-token-rate", "TRUSTD_BAD_TOKEN_RATE", "further attempts per second an address that sent wrong tokens earns back (default 0.1)", false},
		{"max-connections", "TRUSTD_MAX_CONNECTIONS", "open connections accepted at once; more wait in the kernel's accept queue (default 256)", false},
		{"signer-queue", "TRUSTD_SIGNER_QUEUE", "hard bound on requests holding or waiting for the signer; more get ResourceExhausted at once (default 1024)", false},
		{"signer-wait", "TRUSTD_SIGNER_WAIT", "admit only as many requests as the signer, at its measured rate, serves within this time (default 2s)", false},
		{"reload-interval", "TRUSTD_RELOAD_INTERVAL", "how often the cert dir is checked for changes (default 5s)", false},
		{"ready-window", "TRUSTD_READY_WINDOW", "the signer counts as ready for this long after a good signature; idle, it is probed every half window (default 30s)", false},
	}
}

const defaultCertDir = "/etc/steward-trustd/certs"

// registerFlags adds one string flag per setting. Defaults are empty on
// purpose: a default taken from the environment would print secrets in
// --help.
func registerFlags(fs *pflag.FlagSet) {
	for _, s := range settings() {
		fs.String(s.flag, "", fmt.Sprintf("%s [$%s]", s.usage, s.env))
	}
}

// lookup returns a setting's value: the flag if given, else the environment.
type lookup func(name string) (string, bool)

func resolve(fs *pflag.FlagSet, getenv func(string) (string, bool)) lookup {
	byFlag := map[string]setting{}
	for _, s := range settings() {
		byFlag[s.flag] = s
	}
	return func(name string) (string, bool) {
		s := byFlag[name]
		if f := fs.Lookup(name); f != nil && f.Changed {
			return f.Value.String(), true
		}
		return getenv(s.env)
	}
}

// config is the daemon's validated configuration.
type config struct {
	listen   string
	tenant   string
	debug    bool
	certDir  string
	signer   string
	inlineCA []byte // OS CA key held in memory (TRUSTD_OS_CA_KEY), file signer only
	caPEM    []byte // inline CA certificate; nil means <cert-dir>/os-ca.crt
	token    []byte // inline token; nil means <cert-dir>/token
	srvCrt   []byte
	srvKey   []byte
	certSANs []string
	allowed  []netip.Prefix
	peerIP   bool

	healthAddr     string
	rates          server.RateLimits
	maxConns       int
	reloadInterval time.Duration
	readyWindow    time.Duration
}

// configError names the setting at fault, so the daemon exits with one
// clear line.
type configError struct {
	setting setting
	msg     string
}

func (e *configError) Error() string {
	return fmt.Sprintf("invalid configuration: %s (--%s / $%s)", e.msg, e.setting.flag, e.setting.env)
}

func settingByFlag(name string) setting {
	for _, s := range settings() {
		if s.flag == name {
			return s
		}
	}
	return setting{flag: name}
}

func bad(name, format string, args ...any) error {
	return &configError{setting: settingByFlag(name), msg: fmt.Sprintf(format, args...)}
}

func loadConfig(get lookup) (*config, error) {
	c := &config{certDir: defaultCertDir}
	port := 50001
	if v, ok := get("port"); ok && v != "" {
		p, err := strconv.Atoi(v)
		if err != nil || p < 1 || p > 65535 {
			return nil, bad("port", "%q is not a TCP port", v)
		}
		port = p
	}
	host := ""
	if v, ok := get("listen-address"); ok && v != "" {
		a, err := netip.ParseAddr(v)
		if err != nil {
			return nil, bad("listen-address", "%q is not an IP address", v)
		}
		host = a.String()
	}
	c.listen = netJoin(host, port)
	c.tenant, _ = get("tenant")
	var err error
	if c.debug, err = boolSetting(get, "debug"); err != nil {
		return nil, err
	}
	if c.peerIP, err = boolSetting(get, "require-peer-ip"); err != nil {
		return nil, err
	}
	if v, ok := get("cert-dir"); ok && v != "" {
		c.certDir = filepath.Clean(v)
	}
	if c.inlineCA, err = base64Setting(get, "os-ca-key"); err != nil {
		return nil, err
	}
	if c.caPEM, err = base64Setting(get, "os-ca-crt"); err != nil {
		return nil, err
	}
	if c.srvCrt, err = base64Setting(get, "server-crt"); err != nil {
		return nil, err
	}
	if c.srvKey, err = base64Setting(get, "server-key"); err != nil {
		return nil, err
	}
	if (c.srvCrt == nil) != (c.srvKey == nil) {
		return nil, bad("server-key", "the serving certificate and key must be given together (TRUSTD_SERVER_CRT and TRUSTD_SERVER_KEY)")
	}
	if v, ok := get("token"); ok && v != "" {
		c.token = []byte(strings.TrimSpace(v))
	}
	c.signer, _ = get("signer")
	switch {
	case c.signer != "" && c.inlineCA != nil:
		return nil, bad("os-ca-key", "an inline OS CA key contradicts TRUSTD_SIGNER=%s; use one or the other", schemeOf(c.signer))
	case c.signer == "" && c.inlineCA == nil:
		c.signer = file.URI(filepath.Join(c.certDir, certdir.FileCAKey))
	}
	if v, ok := get("cert-sans"); ok {
		c.certSANs = splitList(v)
	}
	if v, ok := get("allowed-san-cidrs"); ok {
		for _, s := range splitList(v) {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return nil, bad("allowed-san-cidrs", "%q is not a CIDR", s)
			}
			c.allowed = append(c.allowed, p.Masked())
		}
	}
	c.healthAddr, _ = get("health-addr")
	if c.rates.PerPeerRate, err = floatSetting(get, "peer-rate"); err != nil {
		return nil, err
	}
	if c.rates.PerPeerBurst, err = intSetting(get, "peer-burst"); err != nil {
		return nil, err
	}
	if c.rates.BadTokenBurst, err = intSetting(get, "bad-token-burst"); err != nil {
		return nil, err
	}
	if c.rates.BadTokenRate, err = floatSetting(get, "bad-token-rate"); err != nil {
		return nil, err
	}
	if c.rates.MaxSignerQueue, err = intSetting(get, "signer-queue"); err != nil {
		return nil, err
	}
	if c.rates.MaxSignerWait, err = durationSetting(get, "signer-wait", 2*time.Second); err != nil {
		return nil, err
	}
	if c.maxConns, err = intSetting(get, "max-connections"); err != nil {
		return nil, err
	}
	if c.maxConns == 0 {
		c.maxConns = 256
	}
	if c.reloadInterval, err = durationSetting(get, "reload-interval", 5*time.Second); err != nil {
		return nil, err
	}
	if c.readyWindow, err = durationSetting(get, "ready-window", 30*time.Second); err != nil {
		return nil, err
	}
	return c, nil
}

func durationSetting(get lookup, name string, def time.Duration) (time.Duration, error) {
	v, ok := get(name)
	if !ok || v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 100*time.Millisecond {
		return 0, bad(name, "%q is not a duration of at least 100ms", v)
	}
	return d, nil
}

func floatSetting(get lookup, name string) (float64, error) {
	v, ok := get(name)
	if !ok || v == "" {
		return 0, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || (f <= 0 && f != -1) {
		return 0, bad(name, "%q is not a positive number or -1", v)
	}
	return f, nil
}

func intSetting(get lookup, name string) (int, error) {
	v, ok := get(name)
	if !ok || v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, bad(name, "%q is not a positive integer", v)
	}
	return n, nil
}

func schemeOf(uri string) string {
	s, _, _ := strings.Cut(uri, ":")
	return s + ":..."
}

func netJoin(host string, port int) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + strconv.Itoa(port)
	}
	return host + ":" + strconv.Itoa(port)
}

func boolSetting(get lookup, name string) (bool, error) {
	v, ok := get(name)
	if !ok || v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, bad(name, "%q is not true or false", v)
	}
	return b, nil
}

// base64Setting decodes a base64 setting. Its value is never echoed: some
// of these settings are keys.
func base64Setting(get lookup, name string) ([]byte, error) {
	v, ok := get(name)
	if !ok || v == "" {
		return nil, nil
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
	if err != nil {
		return nil, bad(name, "value is not valid base64")
	}
	return b, nil
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
