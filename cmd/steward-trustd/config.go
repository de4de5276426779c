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

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
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
		{"token", "TRUSTD_TOKEN", "worker tokens (machine.token), comma-separated, all valid; prefer the token file in the cert dir (one per line)", true},
		{"os-ca-crt", "TRUSTD_OS_CA_CRT", "base64 PEM of the OS CA certificate (default: <cert-dir>/os-ca.crt)", false},
		{"issuer-crt", "TRUSTD_ISSUER_CRT", "base64 PEM of the signing key's certificate chain, its own (intermediate) certificate first, the root excluded: the tiered setup (default: <cert-dir>/issuer.crt if present)", false},
		{"issuer-crt-file", "TRUSTD_ISSUER_CRT_FILE", "path of the issuer chain file instead of <cert-dir>/issuer.crt, e.g. /etc/steward-trustd/nodes/$(NODE_NAME).crt when replicas share one Secret; must exist", false},
		{"os-ca-key", "TRUSTD_OS_CA_KEY", "base64 PEM of the OS CA key, held in memory (file signer only; prefer --signer)", true},
		{"server-crt", "TRUSTD_SERVER_CRT", "base64 PEM of the serving certificate (default: <cert-dir>/server.crt, else self-issued)", false},
		{"server-key", "TRUSTD_SERVER_KEY", "base64 PEM of the serving key (default: <cert-dir>/server.key)", true},
		{"cert-dir", "TRUSTD_CERT_DIR", "directory with os-ca.crt, issuer.crt, os-ca.key, server.crt, server.key, token, accepted-cas.crt", false},
		{"signer", "TRUSTD_SIGNER", "OS CA key URI: file:/path, tpm:..., pkcs11:... (default: file:<cert-dir>/os-ca.key)", false},
		{"cert-sans", "TRUSTD_CERT_SANS", "comma-separated extra IPs/DNS names for the self-issued serving certificate", false},
		{"allowed-san-cidrs", "TRUSTD_ALLOWED_SAN_CIDRS", "comma-separated CIDRs; every IP SAN requested must fall inside one (default: no restriction)", false},
		{"require-peer-ip", "TRUSTD_REQUIRE_PEER_IP", "require the caller's address to be one of the requested IP SANs (--require-peer-ip or =true/false)", false},
		{"debug", "TRUSTD_DEBUG", "debug logging (--debug or =true/false)", false},
		{"health-addr", "TRUSTD_HEALTH_ADDR", "plaintext address for /healthz, /readyz, /metrics and gRPC health, e.g. :50002 (default: off)", false},
		{"peer-rate", "TRUSTD_PEER_RATE", "requests per second allowed from one address, -1 for no limit (default 1)", false},
		{"peer-burst", "TRUSTD_PEER_BURST", "burst of requests allowed from one address (default 20)", false},
		{"bad-token-burst", "TRUSTD_BAD_TOKEN_BURST", "wrong tokens one address may send before it is slowed down (default 5)", false},
		{"bad-token-rate", "TRUSTD_BAD_TOKEN_RATE", "further wrong-token attempts per second such an address earns back, -1 for no limit (default 0.1)", false},
		{"max-connections", "TRUSTD_MAX_CONNECTIONS", "open connections at once (~40 KiB each); when full, more wait in the kernel's accept queue (default 2048)", false},
		{"max-unauthenticated-connections", "TRUSTD_MAX_UNAUTHENTICATED_CONNECTIONS", "connections without a request that passed the token and CSR checks; when full, one of them is closed: silent first, then the busiest address and prefixes, never one younger than eviction-grace (default half of max-connections)", false},
		{"max-connections-per-address", "TRUSTD_MAX_CONNECTIONS_PER_ADDRESS", "open connections from one source address; more are closed at once (default 64)", false},
		{"handshake-timeout", "TRUSTD_HANDSHAKE_TIMEOUT", "time for a connection's TLS and HTTP/2 set-up (default 5s)", false},
		{"auth-timeout", "TRUSTD_AUTH_TIMEOUT", "a connection without a request carrying a valid token this long after it was accepted is closed (default 10s)", false},
		{"first-message-timeout", "TRUSTD_FIRST_MESSAGE_TIMEOUT", "a request stream whose message has not arrived this long after its headers is reset (default 2s)", false},
		{"idle-timeout", "TRUSTD_IDLE_TIMEOUT", "a connection without requests this long is closed (default 30s; one without a request in flight gets a GOAWAY after request-idle-timeout already)", false},
		{"connection-age-grace", "TRUSTD_CONNECTION_AGE_GRACE", "time requests get to finish when a connection reaches its 10-minute age (default 10s)", false},
		{"max-header-bytes", "TRUSTD_MAX_HEADER_BYTES", "bound on a request's header list, in bytes (default 8192)", false},
		{"signer-queue", "TRUSTD_SIGNER_QUEUE", "hard bound on requests holding or waiting for the signer; beyond it the worker seen last gets ResourceExhausted at once (default 1024)", false},
		{"signer-wait", "TRUSTD_SIGNER_WAIT", "deadline of a request that carries none; a request waits for the signer until its deadline and reaches it only if it can finish by then (default 2s)", false},
		{"reload-interval", "TRUSTD_RELOAD_INTERVAL", "how often the cert dir is checked for changes (default 5s)", false},
		{"root-sha256", "TRUSTD_ROOT_SHA256", "comma-separated SHA-256 fingerprints of the DER of the roots os-ca.crt may be (default: any; tiered setup: pin it, as nothing else does at start)", false},
		{"token-reload-force", "TRUSTD_TOKEN_RELOAD_FORCE", "let a hot reload install a token file that keeps none of the running tokens (default false: refused, every worker would fail; a restart always takes the file)", false},
		{"ready-window", "TRUSTD_READY_WINDOW", "the signer counts as ready for this long after a good signature; idle, it is probed every half window (default 30s)", false},
		{"max-authenticated-per-prefix", "TRUSTD_MAX_AUTHENTICATED_PER_PREFIX", "connections of one prefix (see connection-prefixes) that count as authenticated at once; beyond it requests are served on evictable connections (default half of max-connections)", false},
		{"connection-prefixes-v4", "TRUSTD_CONNECTION_PREFIXES_V4", "comma-separated IPv4 prefix lengths over which the busiest clients are counted besides single addresses (default 24,16)", false},
		{"connection-prefixes-v6", "TRUSTD_CONNECTION_PREFIXES_V6", "comma-separated IPv6 prefix lengths, likewise (default 64,48)", false},
		{"known-worker-reserve", "TRUSTD_KNOWN_WORKER_RESERVE", "unauthenticated slots that addresses unknown as workers cannot take (default a quarter of max-unauthenticated-connections)", false},
		{"known-worker-ttl", "TRUSTD_KNOWN_WORKER_TTL", "how long an address whose request passed stays a known worker (default 25h)", false},
		{"eviction-grace", "TRUSTD_EVICTION_GRACE", "a new connection keeps its slot this long whatever comes after it (default 2s)", false},
		{"defer-accept", "TRUSTD_DEFER_ACCEPT", "the kernel holds a connection that has sent nothing this long (TCP_DEFER_ACCEPT), then it is closed; 'off' to hand over every connection at once (default 3s)", false},
		{"request-idle-timeout", "TRUSTD_REQUEST_IDLE_TIMEOUT", "a connection this long after its last request ended is closed; below auth-timeout (default 2s)", false},
	}
}

const defaultCertDir = "/etc/steward-trustd/certs"

// registerFlags adds one string flag per setting. Defaults are empty on
// purpose: a default taken from the environment would print secrets in
// --help. Boolean settings also work bare (--debug means --debug=true).
func registerFlags(fs *pflag.FlagSet) {
	for _, s := range settings() {
		fs.String(s.flag, "", fmt.Sprintf("%s [$%s]", s.usage, s.env))
		if isBoolSetting(s.flag) {
			fs.Lookup(s.flag).NoOptDefVal = "true"
		}
	}
}

// isBoolSetting tells the settings that are true or false.
func isBoolSetting(flag string) bool {
	return flag == "debug" || flag == "require-peer-ip" || flag == "token-reload-force"
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
	listen     string
	tenant     string
	debug      bool
	certDir    string
	signer     string
	inlineCA   []byte // OS CA key held in memory (TRUSTD_OS_CA_KEY), file signer only
	caPEM      []byte // inline CA certificate; nil means <cert-dir>/os-ca.crt
	issuer     []byte // inline issuer chain; nil means issuerFile, else <cert-dir>/issuer.crt if present
	issuerFile string
	rootPins   []string
	token      []byte // inline token; nil means <cert-dir>/token
	srvCrt     []byte
	srvKey     []byte
	certSANs   []string
	allowed    []netip.Prefix
	peerIP     bool

	healthAddr     string
	rates          server.RateLimits
	conns          server.ConnLimits
	reloadInterval time.Duration
	readyWindow    time.Duration
	tokenForce     bool
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
	for _, load := range []func(*config, lookup) error{loadListen, loadInline, loadPolicy, loadRates, loadConns, loadFrontDoor, loadIntervals} {
		if err := load(c, get); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func loadListen(c *config, get lookup) error {
	port := 50001
	if v, ok := get("port"); ok && v != "" {
		p, err := strconv.Atoi(v)
		if err != nil || p < 1 || p > 65535 {
			return bad("port", "%q is not a TCP port", v)
		}
		port = p
	}
	host := ""
	if v, ok := get("listen-address"); ok && v != "" {
		a, err := netip.ParseAddr(v)
		if err != nil {
			return bad("listen-address", "%q is not an IP address", v)
		}
		host = a.String()
	}
	c.listen = netJoin(host, port)
	c.tenant, _ = get("tenant")
	c.healthAddr, _ = get("health-addr")
	var err error
	c.debug, err = boolSetting(get, "debug")
	return err
}

// loadInline reads the cert dir, the signer and the inline credentials.
func loadInline(c *config, get lookup) error {
	if v, ok := get("cert-dir"); ok && v != "" {
		// The reloader re-reads files by name for as long as the daemon
		// runs; a relative path would follow whatever working directory
		// the service manager chose.
		if !filepath.IsAbs(v) {
			return bad("cert-dir", "%q is a relative path: give the absolute path, e.g. %s or \"$PWD/%s\"", v, defaultCertDir, filepath.Clean(v))
		}
		c.certDir = filepath.Clean(v)
	}
	var err error
	for _, b := range []struct {
		name string
		dst  *[]byte
	}{{"os-ca-key", &c.inlineCA}, {"os-ca-crt", &c.caPEM}, {"issuer-crt", &c.issuer}, {"server-crt", &c.srvCrt}, {"server-key", &c.srvKey}} {
		if *b.dst, err = base64Setting(get, b.name); err != nil {
			return err
		}
	}
	if c.issuerFile, _ = get("issuer-crt-file"); c.issuerFile != "" && c.issuer != nil {
		return bad("issuer-crt-file", "an issuer chain file contradicts TRUSTD_ISSUER_CRT; use one or the other")
	}
	if (c.srvCrt == nil) != (c.srvKey == nil) {
		return bad("server-key", "the serving certificate and key must be given together (TRUSTD_SERVER_CRT and TRUSTD_SERVER_KEY)")
	}
	if c.rootPins, err = rootPins(get); err != nil {
		return err
	}
	if v, ok := get("token"); ok && v != "" {
		// Comma-separated tokens become the token file's one per line.
		c.token = []byte(strings.Join(cli.SplitList(v), "\n"))
	}
	c.signer, _ = get("signer")
	switch {
	case c.signer != "" && c.inlineCA != nil:
		return bad("os-ca-key", "an inline OS CA key contradicts TRUSTD_SIGNER=%s; use one or the other", schemeOf(c.signer))
	case c.signer == "" && c.inlineCA == nil:
		c.signer = file.URI(filepath.Join(c.certDir, certdir.FileCAKey))
	}
	return nil
}

func loadPolicy(c *config, get lookup) error {
	var err error
	if c.peerIP, err = boolSetting(get, "require-peer-ip"); err != nil {
		return err
	}
	if c.tokenForce, err = boolSetting(get, "token-reload-force"); err != nil {
		return err
	}
	if v, ok := get("cert-sans"); ok {
		c.certSANs = cli.SplitList(v)
	}
	if v, ok := get("allowed-san-cidrs"); ok {
		for _, s := range cli.SplitList(v) {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return bad("allowed-san-cidrs", "%q is not a CIDR", s)
			}
			c.allowed = append(c.allowed, p.Masked())
		}
	}
	return nil
}

func loadRates(c *config, get lookup) error {
	return firstErr(
		floatInto(get, "peer-rate", &c.rates.PerPeerRate),
		intInto(get, "peer-burst", &c.rates.PerPeerBurst),
		intInto(get, "bad-token-burst", &c.rates.BadTokenBurst),
		floatInto(get, "bad-token-rate", &c.rates.BadTokenRate),
		intInto(get, "signer-queue", &c.rates.MaxSignerQueue),
		durationInto(get, "signer-wait", 2*time.Second, &c.rates.MaxSignerWait),
	)
}

// loadConns reads the connection limits; unset ones stay zero and take
// server.ConnLimits' defaults.
func loadConns(c *config, get lookup) error {
	l := &c.conns
	err := firstErr(
		intInto(get, "max-connections", &l.MaxConnections),
		intInto(get, "max-unauthenticated-connections", &l.MaxUnauthenticated),
		intInto(get, "max-connections-per-address", &l.MaxPerAddress),
		durationInto(get, "handshake-timeout", 0, &l.HandshakeTimeout),
		durationInto(get, "auth-timeout", 0, &l.AuthTimeout),
		durationInto(get, "first-message-timeout", 0, &l.FirstMessageTimeout),
		durationInto(get, "idle-timeout", 0, &l.IdleTimeout),
		durationInto(get, "connection-age-grace", 0, &l.MaxAgeGrace),
		intInto(get, "max-header-bytes", &l.MaxHeaderBytes),
	)
	if err == nil && l.MaxHeaderBytes != 0 && (l.MaxHeaderBytes < 1024 || l.MaxHeaderBytes > 1<<20) {
		err = bad("max-header-bytes", "%d is outside 1024..1048576", l.MaxHeaderBytes)
	}
	if err == nil && l.MaxUnauthenticated > 0 && l.MaxConnections > 0 && l.MaxUnauthenticated > l.MaxConnections {
		err = bad("max-unauthenticated-connections", "%d exceeds TRUSTD_MAX_CONNECTIONS (%d)", l.MaxUnauthenticated, l.MaxConnections)
	}
	return err
}

func loadIntervals(c *config, get lookup) error {
	return firstErr(
		durationInto(get, "reload-interval", 5*time.Second, &c.reloadInterval),
		durationInto(get, "ready-window", 30*time.Second, &c.readyWindow),
	)
}

// firstErr returns the first non-nil error: settings are checked in
// order and the first bad one is reported.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func intInto(get lookup, name string, dst *int) (err error) {
	*dst, err = intSetting(get, name)
	return err
}

func floatInto(get lookup, name string, dst *float64) (err error) {
	*dst, err = floatSetting(get, name)
	return err
}

func durationInto(get lookup, name string, def time.Duration, dst *time.Duration) (err error) {
	*dst, err = durationSetting(get, name, def)
	return err
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

// rootPins parses TRUSTD_ROOT_SHA256: hex SHA-256 fingerprints (as
// `openssl x509 -in os-ca.crt -outform der | sha256sum` prints them,
// colons allowed), lower-cased.
func rootPins(get lookup) ([]string, error) {
	v, _ := get("root-sha256")
	var pins []string
	for _, p := range cli.SplitList(v) {
		fp, err := pki.ParseFingerprint(p)
		if err != nil {
			return nil, bad("root-sha256", "%v", err)
		}
		pins = append(pins, fp)
	}
	return pins, nil
}
