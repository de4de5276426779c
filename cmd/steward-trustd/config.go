package main

import (
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/steward-trustd/steward-trustd/server"
)

// config is the daemon's validated configuration.
type config struct {
	listen     string // host:port, from listenHost and port
	listenHost string
	port       int
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
	authz          authorizerConfig

	logMode     string // TRUSTD_LOG: required or off
	logDir      string
	logKey      string
	logInterval time.Duration
}

// setting is one row of the configuration table: a flag, its environment
// variable, its one default and the typed field of config it fills.
type setting struct {
	flag    string
	env     string
	def     string // the value when neither flag nor variable is set, as a user would write it; "" for none
	derived string // the default in words when it follows from other settings (def is then "")
	doc     string
	to      field
}

// settings is the configuration table: it generates the flags, their
// environment variables, --help and README's configuration table
// (TestREADMEConfigTable), and loadConfig fills c from it.
//
// To add a setting: add its field to config and one row here — flag,
// TRUSTD_ variable, default, doc and the field with its parser (posInt,
// duration, boolean, text, base64Bytes, … in config_fields.go). A rule
// between several settings goes into checkConfig. Then regenerate README's
// table: STEWARD_UPDATE_README=1 go test ./cmd/steward-trustd -run TestREADMEConfigTable
func (c *config) settings() []setting {
	return append(append(append(c.listenSettings(), c.credentialSettings()...), append(c.limitSettings(), c.frontDoorSettings()...)...), append(c.logSettings(), c.authorizerSettings()...)...)
}

func (c *config) listenSettings() []setting {
	return []setting{
		{flag: "port", env: "TRUSTD_PORT", def: "50001", doc: "port of the SecurityService (workers always dial 50001)", to: bind("int", &c.port, tcpPort)},
		{flag: "listen-address", env: "TRUSTD_LISTEN_ADDRESS", derived: "all", doc: "IP address to bind", to: bind("ip", &c.listenHost, ipAddress)},
		{flag: "tenant", env: "TRUSTD_TENANT", doc: "cluster name recorded in logs and audit lines", to: text(&c.tenant)},
		{flag: "debug", env: "TRUSTD_DEBUG", def: "false", doc: "debug logging (--debug alone means true)", to: boolean(&c.debug)},
		{flag: "health-addr", env: "TRUSTD_HEALTH_ADDR", derived: "off", doc: "plaintext address for /healthz, /readyz, /metrics and the gRPC health service, e.g. :50002", to: text(&c.healthAddr)},
		{flag: "ready-window", env: "TRUSTD_READY_WINDOW", def: "30s", doc: "ready while a signature succeeded within this window; when idle the signer is probed every half window", to: duration(&c.readyWindow)},
		{flag: "reload-interval", env: "TRUSTD_RELOAD_INTERVAL", def: "5s", doc: "how often the cert dir is checked for changed files", to: duration(&c.reloadInterval)},
	}
}

func (c *config) credentialSettings() []setting {
	return []setting{
		{flag: "cert-dir", env: "TRUSTD_CERT_DIR", def: "/etc/steward-trustd/certs", doc: "an absolute path (a relative one exits 2): os-ca.crt, issuer.crt, os-ca.key, server.crt, server.key, token, accepted-cas.crt, accepted-cas.statement.json", to: bind("path", &c.certDir, absPath)},
		{flag: "signer", env: "TRUSTD_SIGNER", derived: "file:<cert-dir>/os-ca.key", doc: "key URI of the OS CA key: file:, tpm:, pkcs11:", to: text(&c.signer)},
		{flag: "token", env: "TRUSTD_TOKEN", derived: "<cert-dir>/token", doc: "the workers' machine.token; several, comma-separated, are all valid (the file: one per line; see keystore/README.md, rotating the join token)", to: bind("tokens", &c.token, tokenList)},
		{flag: "os-ca-crt", env: "TRUSTD_OS_CA_CRT", derived: "<cert-dir>/os-ca.crt", doc: "base64 PEM of the OS CA certificate", to: base64Bytes(&c.caPEM)},
		{flag: "issuer-crt", env: "TRUSTD_ISSUER_CRT", derived: "<cert-dir>/issuer.crt if present", doc: "base64 PEM of the signing key's chain in the tiered setup: its own intermediate first, the root excluded", to: base64Bytes(&c.issuer)},
		{flag: "issuer-crt-file", env: "TRUSTD_ISSUER_CRT_FILE", derived: "<cert-dir>/issuer.crt", doc: "path of the issuer chain file instead, e.g. /etc/steward-trustd/nodes/$(NODE_NAME).crt when replicas share one Secret; must exist (contradicts TRUSTD_ISSUER_CRT)", to: text(&c.issuerFile)},
		{flag: "os-ca-key", env: "TRUSTD_OS_CA_KEY", doc: "base64 PEM of the OS CA key, held in memory (file signer only; contradicts TRUSTD_SIGNER)", to: base64Bytes(&c.inlineCA)},
		{flag: "server-crt", env: "TRUSTD_SERVER_CRT", derived: "<cert-dir>/server.crt, else self-issued", doc: "base64 PEM of the serving certificate, given together with TRUSTD_SERVER_KEY", to: base64Bytes(&c.srvCrt)},
		{flag: "server-key", env: "TRUSTD_SERVER_KEY", derived: "<cert-dir>/server.key", doc: "base64 PEM of the serving key, given together with TRUSTD_SERVER_CRT", to: base64Bytes(&c.srvKey)},
		{flag: "cert-sans", env: "TRUSTD_CERT_SANS", doc: "extra IPs/DNS names for the self-issued serving certificate, comma-separated (a loaded server.crt wins; one that lacks an entry is warned about at start)", to: list(&c.certSANs)},
		{flag: "allowed-san-cidrs", env: "TRUSTD_ALLOWED_SAN_CIDRS", derived: "off", doc: "comma-separated CIDRs; every IP SAN a worker asks for must fall inside one of them", to: bind("cidrs", &c.allowed, cidrList)},
		{flag: "require-peer-ip", env: "TRUSTD_REQUIRE_PEER_IP", def: "false", doc: "the caller's address must be one of the IP SANs it asks for (--require-peer-ip alone means true)", to: boolean(&c.peerIP)},
		{flag: "root-sha256", env: "TRUSTD_ROOT_SHA256", derived: "any", doc: "comma-separated SHA-256 fingerprints of the DER of the roots os-ca.crt may be; any other is refused at start and at reload (tiered setup: pin it, as nothing else does at start)", to: bind("fingerprints", &c.rootPins, fingerprintList)},
		{flag: "token-reload-force", env: "TRUSTD_TOKEN_RELOAD_FORCE", def: "false", doc: "let a hot reload install a token file that keeps none of the running tokens (otherwise refused: every worker would fail; a restart always takes the file)", to: boolean(&c.tokenForce)},
	}
}

func (c *config) limitSettings() []setting {
	r, l := &c.rates, &c.conns
	return []setting{
		{flag: "peer-rate", env: "TRUSTD_PEER_RATE", def: "1", doc: "requests per second per source address (token bucket); -1 disables", to: rate(&r.PerPeerRate)},
		{flag: "peer-burst", env: "TRUSTD_PEER_BURST", def: "20", doc: "burst of requests per source address", to: posInt(&r.PerPeerBurst)},
		{flag: "bad-token-burst", env: "TRUSTD_BAD_TOKEN_BURST", def: "5", doc: "wrong tokens one address may send before its wrong tokens are slowed down (a valid token never is)", to: posInt(&r.BadTokenBurst)},
		{flag: "bad-token-rate", env: "TRUSTD_BAD_TOKEN_RATE", def: "0.1", doc: "wrong-token attempts per second such an address earns back; -1 disables", to: rate(&r.BadTokenRate)},
		{flag: "signer-queue", env: "TRUSTD_SIGNER_QUEUE", def: "1024", doc: "hard bound on requests holding or waiting for the signer; beyond it the worker seen last gets ResourceExhausted at once", to: posInt(&r.MaxSignerQueue)},
		{flag: "signer-wait", env: "TRUSTD_SIGNER_WAIT", def: "2s", doc: "the deadline of a request that carries none (workers carry their 10 s attempt's); a request waits in line until its deadline and reaches the device only if it can finish by then", to: duration(&r.MaxSignerWait)},
		{flag: "max-connections", env: "TRUSTD_MAX_CONNECTIONS", def: "2048", doc: "open connections at once (~40 KiB each); at the cap, more wait in the kernel accept queue, none is accepted only to be cut", to: posInt(&l.MaxConnections)},
		{flag: "max-unauthenticated-connections", env: "TRUSTD_MAX_UNAUTHENTICATED_CONNECTIONS", derived: "half of max-connections", doc: "connections without a request in flight that passed the token and CSR checks; when full, a new connection closes one older than eviction-grace: silent first, then the busiest address and prefixes, then the oldest", to: posInt(&l.MaxUnauthenticated)},
		{flag: "max-connections-per-address", env: "TRUSTD_MAX_CONNECTIONS_PER_ADDRESS", def: "64", doc: "open connections from one source address, checked before any other slot is taken; more are closed at once (raise it for many workers behind one NAT)", to: posInt(&l.MaxPerAddress)},
		{flag: "handshake-timeout", env: "TRUSTD_HANDSHAKE_TIMEOUT", def: "5s", doc: "time for a connection's TLS and HTTP/2 set-up", to: duration(&l.HandshakeTimeout)},
		{flag: "auth-timeout", env: "TRUSTD_AUTH_TIMEOUT", def: "10s", doc: "a connection that has not carried a request with a valid token this long after it was accepted is closed", to: duration(&l.AuthTimeout)},
		{flag: "first-message-timeout", env: "TRUSTD_FIRST_MESSAGE_TIMEOUT", def: "2s", doc: "a request stream whose message has not arrived this long after its headers is reset (workers send the CSR at once)", to: duration(&l.FirstMessageTimeout)},
		{flag: "idle-timeout", env: "TRUSTD_IDLE_TIMEOUT", def: "30s", doc: "a connection without a request this long is closed (GOAWAY); request-idle-timeout applies first", to: duration(&l.IdleTimeout)},
		{flag: "connection-age-grace", env: "TRUSTD_CONNECTION_AGE_GRACE", def: "10s", doc: "time requests get to finish when a connection reaches its 10-minute maximum age", to: duration(&l.MaxAgeGrace)},
		{flag: "max-header-bytes", env: "TRUSTD_MAX_HEADER_BYTES", def: "8192", doc: "bound on a request's header list, 1024 to 1048576 bytes; a worker sends a few hundred", to: bind("int", &l.MaxHeaderBytes, intIn(1024, 1<<20))},
	}
}

func (c *config) frontDoorSettings() []setting {
	l := &c.conns
	return []setting{
		{flag: "defer-accept", env: "TRUSTD_DEFER_ACCEPT", def: "3s", doc: "the kernel holds a connection that has sent nothing this long (TCP_DEFER_ACCEPT, whole seconds up to 1m); one handed over still silent is closed at once; off hands every connection over at once", to: bind("duration", &l.DeferAccept, deferAccept)},
		{flag: "eviction-grace", env: "TRUSTD_EVICTION_GRACE", def: "2s", doc: "a new connection keeps its slot this long whatever arrives after it (a worker a WAN away finishes its handshake)", to: duration(&l.EvictionGrace)},
		{flag: "connection-prefixes-v4", env: "TRUSTD_CONNECTION_PREFIXES_V4", def: "24,16", doc: "comma-separated IPv4 prefix lengths over which the busiest clients are counted besides single addresses", to: bind("ints", &l.PrefixesV4, prefixLengths(32))},
		{flag: "connection-prefixes-v6", env: "TRUSTD_CONNECTION_PREFIXES_V6", def: "64,48", doc: "comma-separated IPv6 prefix lengths, likewise", to: bind("ints", &l.PrefixesV6, prefixLengths(128))},
		{flag: "known-worker-reserve", env: "TRUSTD_KNOWN_WORKER_RESERVE", derived: "a quarter of max-unauthenticated-connections", doc: "unauthenticated slots that addresses not known as workers cannot take: known workers (a request passed within known-worker-ttl) get in first", to: posInt(&l.KnownWorkerReserve)},
		{flag: "known-worker-ttl", env: "TRUSTD_KNOWN_WORKER_TTL", def: "25h", doc: "how long an address whose request passed stays a known worker (a worker renews every 12 h)", to: duration(&l.KnownWorkerTTL)},
		{flag: "max-authenticated-per-prefix", env: "TRUSTD_MAX_AUTHENTICATED_PER_PREFIX", derived: "half of max-connections", doc: "connections of one prefix counted as authenticated at once; beyond it requests are served on evictable connections", to: posInt(&l.MaxAuthenticatedPerPrefix)},
		{flag: "request-idle-timeout", env: "TRUSTD_REQUEST_IDLE_TIMEOUT", def: "2s", doc: "a connection without a request in flight gets a GOAWAY this soon (below auth-timeout: a token is no lease) and is closed at twice that", to: duration(&l.RequestIdleTimeout)},
	}
}

// lookup returns a setting's text by flag name: the flag if given, else
// its environment variable.
type lookup func(flag string) (string, bool)

// loadConfig fills a config from the table: every setting from its flag,
// else its variable, else its default; then the rules between settings.
func loadConfig(get lookup) (*config, error) {
	c := &config{}
	for _, s := range c.settings() {
		v, _ := get(s.flag)
		if v == "" {
			v = s.def
		}
		if v == "" {
			continue
		}
		if err := s.to.set(v); err != nil {
			return nil, &configError{setting: s, msg: err.Error()}
		}
	}
	c.listen = net.JoinHostPort(c.listenHost, strconv.Itoa(c.port))
	return c, checkConfig(c)
}
