package main

import (
	"encoding/base64"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/steward-trustd/steward-trustd/server"
)

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	b64 := base64.StdEncoding.EncodeToString([]byte("pem"))
	cases := []configCase{
		{name: "defaults", check: func(t *testing.T, c *config) {
			if c.listen != ":50001" || c.signer != "file:///etc/steward-trustd/certs/os-ca.key" {
				t.Fatalf("listen %q signer %q", c.listen, c.signer)
			}
		}},
		{name: "env", env: map[string]string{"TRUSTD_PORT": "6000", "TRUSTD_LISTEN_ADDRESS": "::1", "TRUSTD_CERT_DIR": "/x/", "TRUSTD_ALLOWED_SAN_CIDRS": "10.0.0.1/8, fd00::/8", "TRUSTD_REQUIRE_PEER_IP": "true"},
			check: func(t *testing.T, c *config) {
				if c.listen != "[::1]:6000" || c.signer != "file:///x/os-ca.key" || len(c.allowed) != 2 || c.allowed[0].String() != "10.0.0.0/8" || !c.peerIP {
					t.Fatalf("%+v", c)
				}
			}},
		{name: "flag wins over env", env: map[string]string{"TRUSTD_PORT": "6000"}, flags: []string{"--port=7000"},
			check: func(t *testing.T, c *config) {
				if c.listen != ":7000" {
					t.Fatalf("listen %q", c.listen)
				}
			}},
		{name: "rates", env: map[string]string{"TRUSTD_PEER_RATE": "-1", "TRUSTD_PEER_BURST": "50", "TRUSTD_BAD_TOKEN_BURST": "3", "TRUSTD_BAD_TOKEN_RATE": "0.5", "TRUSTD_SIGNER_QUEUE": "100", "TRUSTD_SIGNER_WAIT": "500ms", "TRUSTD_MAX_CONNECTIONS": "64"},
			check: func(t *testing.T, c *config) {
				r := c.rates
				if r.PerPeerRate != -1 || r.PerPeerBurst != 50 || r.BadTokenBurst != 3 || r.BadTokenRate != 0.5 || r.MaxSignerQueue != 100 || r.MaxSignerWait != 500*time.Millisecond || c.conns.MaxConnections != 64 {
					t.Fatalf("%+v conns=%+v", r, c.conns)
				}
			}},
		{name: "bad rate", env: map[string]string{"TRUSTD_BAD_TOKEN_RATE": "0"}, wantErr: "TRUSTD_BAD_TOKEN_RATE"},
		{name: "bad queue", env: map[string]string{"TRUSTD_SIGNER_QUEUE": "-3"}, wantErr: "TRUSTD_SIGNER_QUEUE"},
		{name: "bad wait", env: map[string]string{"TRUSTD_SIGNER_WAIT": "1ns"}, wantErr: "TRUSTD_SIGNER_WAIT"},
		{name: "bad port", env: map[string]string{"TRUSTD_PORT": "70000"}, wantErr: "TRUSTD_PORT"},
		{name: "relative cert dir", env: map[string]string{"TRUSTD_CERT_DIR": "certs"}, wantErr: `"certs" is a relative path: give the absolute path`},
		{name: "relative cert dir flag", flags: []string{"--cert-dir=./certs/"}, wantErr: "--cert-dir / $TRUSTD_CERT_DIR"},
		{name: "bad listen", env: map[string]string{"TRUSTD_LISTEN_ADDRESS": "example.com"}, wantErr: "TRUSTD_LISTEN_ADDRESS"},
		{name: "bad bool", env: map[string]string{"TRUSTD_DEBUG": "yes please"}, wantErr: "TRUSTD_DEBUG"},
		{name: "bad cidr", env: map[string]string{"TRUSTD_ALLOWED_SAN_CIDRS": "10.0.0.0/33"}, wantErr: "TRUSTD_ALLOWED_SAN_CIDRS"},
		{name: "bad base64", env: map[string]string{"TRUSTD_OS_CA_KEY": "%%%secret%%%"}, wantErr: "TRUSTD_OS_CA_KEY"},
		{name: "crt without key", env: map[string]string{"TRUSTD_SERVER_CRT": b64}, wantErr: "TRUSTD_SERVER_KEY"},
		{name: "inline key and signer", env: map[string]string{"TRUSTD_OS_CA_KEY": b64, "TRUSTD_SIGNER": "tpm:handle=0x81000100"}, wantErr: "TRUSTD_OS_CA_KEY"},
		{name: "inline issuer chain", env: map[string]string{"TRUSTD_ISSUER_CRT": b64}, check: func(t *testing.T, c *config) {
			if string(c.issuer) != "pem" {
				t.Fatalf("issuer %q", c.issuer)
			}
		}},
		{name: "issuer file", env: map[string]string{"TRUSTD_ISSUER_CRT_FILE": "/n/a.crt"}, check: func(t *testing.T, c *config) {
			if c.issuerFile != "/n/a.crt" {
				t.Fatalf("issuer file %q", c.issuerFile)
			}
		}},
		{name: "issuer file and inline", env: map[string]string{"TRUSTD_ISSUER_CRT_FILE": "/n/a.crt", "TRUSTD_ISSUER_CRT": b64}, wantErr: "TRUSTD_ISSUER_CRT_FILE"},
		{name: "bad issuer base64", env: map[string]string{"TRUSTD_ISSUER_CRT": "%%%"}, wantErr: "TRUSTD_ISSUER_CRT"},
		{name: "inline key", env: map[string]string{"TRUSTD_OS_CA_KEY": b64}, check: func(t *testing.T, c *config) {
			if c.signer != "" || string(c.inlineCA) != "pem" {
				t.Fatalf("signer %q inline %q", c.signer, c.inlineCA)
			}
		}},
	}
	runConfigCases(t, cases)
}

// configCase is one configuration and what loading it must give.
// TestLoadConfigTrust covers the root pin and the forced token reload.
func TestLoadConfigTrust(t *testing.T) {
	t.Parallel()
	runConfigCases(t, []configCase{
		{name: "bad root pin", env: map[string]string{"TRUSTD_ROOT_SHA256": "abc"}, wantErr: "TRUSTD_ROOT_SHA256"},
		{name: "bad token force", env: map[string]string{"TRUSTD_TOKEN_RELOAD_FORCE": "maybe"}, wantErr: "TRUSTD_TOKEN_RELOAD_FORCE"},
		{name: "root pins and token force", env: map[string]string{"TRUSTD_ROOT_SHA256": strings.Repeat("AB:", 31) + "AB, " + strings.Repeat("0", 64), "TRUSTD_TOKEN_RELOAD_FORCE": "true"},
			check: func(t *testing.T, c *config) {
				if len(c.rootPins) != 2 || c.rootPins[0] != strings.Repeat("ab", 32) || !c.tokenForce {
					t.Fatalf("pins %v force %v", c.rootPins, c.tokenForce)
				}
			}},
	})
}

type configCase struct {
	name    string
	env     map[string]string
	flags   []string
	wantErr string // names the setting at fault
	check   func(t *testing.T, c *config)
}

func runConfigCases(t *testing.T, cases []configCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
			registerFlags(fs)
			if err := fs.Parse(tc.flags); err != nil {
				t.Fatal(err)
			}
			getenv := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			c, err := loadConfig(resolve(fs, getenv))
			if tc.wantErr != "" {
				var ce *configError
				if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want a config error naming %s", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "secret") {
					t.Fatal("error echoes the value")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

// TestLoadConfigFrontDoor covers the connection limits, the token set and
// the bare booleans.
func TestLoadConfigFrontDoor(t *testing.T) {
	t.Parallel()
	runConfigCases(t, []configCase{
		{name: "bare booleans", flags: []string{"--debug", "--require-peer-ip"}, check: func(t *testing.T, c *config) {
			if !c.debug || !c.peerIP {
				t.Fatalf("debug %v peerIP %v", c.debug, c.peerIP)
			}
		}},
		{name: "explicit false wins over env", env: map[string]string{"TRUSTD_DEBUG": "true"}, flags: []string{"--debug=false"}, check: func(t *testing.T, c *config) {
			if c.debug {
				t.Fatal("--debug=false ignored")
			}
		}},
		{name: "several tokens", env: map[string]string{"TRUSTD_TOKEN": " old.token1 , new.token2,"}, check: func(t *testing.T, c *config) {
			if string(c.token) != "old.token1\nnew.token2" {
				t.Fatalf("tokens %q", c.token)
			}
		}},
		{name: "connection limits", env: map[string]string{"TRUSTD_MAX_CONNECTIONS": "100", "TRUSTD_MAX_UNAUTHENTICATED_CONNECTIONS": "40",
			"TRUSTD_MAX_CONNECTIONS_PER_ADDRESS": "8", "TRUSTD_HANDSHAKE_TIMEOUT": "3s", "TRUSTD_AUTH_TIMEOUT": "7s", "TRUSTD_FIRST_MESSAGE_TIMEOUT": "1s",
			"TRUSTD_IDLE_TIMEOUT": "20s", "TRUSTD_CONNECTION_AGE_GRACE": "5s", "TRUSTD_MAX_HEADER_BYTES": "4096"},
			check: func(t *testing.T, c *config) {
				want := defaultConns()
				want.MaxConnections, want.MaxUnauthenticated, want.MaxPerAddress, want.MaxHeaderBytes = 100, 40, 8, 4096
				want.HandshakeTimeout, want.AuthTimeout, want.FirstMessageTimeout = 3*time.Second, 7*time.Second, time.Second
				want.IdleTimeout, want.MaxAgeGrace = 20*time.Second, 5*time.Second
				if !reflect.DeepEqual(c.conns, want) {
					t.Fatalf("%+v", c.conns)
				}
			}},
		{name: "unset connection limits take the defaults", check: func(t *testing.T, c *config) {
			if !reflect.DeepEqual(c.conns, defaultConns()) {
				t.Fatalf("%+v", c.conns)
			}
		}},
		{name: "front-door settings", env: map[string]string{"TRUSTD_MAX_AUTHENTICATED_PER_PREFIX": "50", "TRUSTD_CONNECTION_PREFIXES_V4": "24, 20",
			"TRUSTD_CONNECTION_PREFIXES_V6": "56", "TRUSTD_KNOWN_WORKER_RESERVE": "30", "TRUSTD_KNOWN_WORKER_TTL": "48h", "TRUSTD_EVICTION_GRACE": "3s",
			"TRUSTD_DEFER_ACCEPT": "off", "TRUSTD_REQUEST_IDLE_TIMEOUT": "1s"},
			check: func(t *testing.T, c *config) {
				want := defaultConns()
				want.MaxAuthenticatedPerPrefix, want.PrefixesV4, want.PrefixesV6, want.KnownWorkerReserve = 50, []int{24, 20}, []int{56}, 30
				want.KnownWorkerTTL, want.EvictionGrace, want.DeferAccept, want.RequestIdleTimeout = 48*time.Hour, 3*time.Second, -1, time.Second
				if !reflect.DeepEqual(c.conns, want) {
					t.Fatalf("%+v", c.conns)
				}
			}},
		{name: "bad prefix", env: map[string]string{"TRUSTD_CONNECTION_PREFIXES_V4": "24,33"}, wantErr: "TRUSTD_CONNECTION_PREFIXES_V4"},
		{name: "bad defer accept", env: map[string]string{"TRUSTD_DEFER_ACCEPT": "200ms"}, wantErr: "TRUSTD_DEFER_ACCEPT"},
		{name: "reserve over the budget", env: map[string]string{"TRUSTD_MAX_UNAUTHENTICATED_CONNECTIONS": "40", "TRUSTD_KNOWN_WORKER_RESERVE": "40"}, wantErr: "TRUSTD_KNOWN_WORKER_RESERVE"},
		{name: "served idle not sooner", env: map[string]string{"TRUSTD_AUTH_TIMEOUT": "5s", "TRUSTD_REQUEST_IDLE_TIMEOUT": "6s"}, wantErr: "TRUSTD_REQUEST_IDLE_TIMEOUT"},
		{name: "bad header bound", env: map[string]string{"TRUSTD_MAX_HEADER_BYTES": "100"}, wantErr: "TRUSTD_MAX_HEADER_BYTES"},
		{name: "zero per-address cap", env: map[string]string{"TRUSTD_MAX_CONNECTIONS_PER_ADDRESS": "0"}, wantErr: "TRUSTD_MAX_CONNECTIONS_PER_ADDRESS"},
		{name: "unauthenticated over total", env: map[string]string{"TRUSTD_MAX_CONNECTIONS": "10", "TRUSTD_MAX_UNAUTHENTICATED_CONNECTIONS": "20"}, wantErr: "TRUSTD_MAX_UNAUTHENTICATED_CONNECTIONS"},
		{name: "negative timeout", env: map[string]string{"TRUSTD_FIRST_MESSAGE_TIMEOUT": "-1s"}, wantErr: "TRUSTD_FIRST_MESSAGE_TIMEOUT"},
		{name: "bad token rate disabled", env: map[string]string{"TRUSTD_BAD_TOKEN_RATE": "-1"}, check: func(t *testing.T, c *config) {
			if c.rates.BadTokenRate != -1 {
				t.Fatalf("%v", c.rates.BadTokenRate)
			}
		}},
	})
}

// defaultConns is the connection limits of an empty configuration: the
// server's documented defaults (server.ConnLimits), with the budgets that
// follow from MaxConnections left to the server.
func defaultConns() server.ConnLimits {
	return server.ConnLimits{MaxConnections: 2048, MaxPerAddress: 64, PrefixesV4: []int{24, 16}, PrefixesV6: []int{64, 48},
		KnownWorkerTTL: 25 * time.Hour, EvictionGrace: 2 * time.Second, DeferAccept: 3 * time.Second, HandshakeTimeout: 5 * time.Second,
		AuthTimeout: 10 * time.Second, RequestIdleTimeout: 2 * time.Second, FirstMessageTimeout: 2 * time.Second, IdleTimeout: 30 * time.Second,
		MaxAgeGrace: 10 * time.Second, MaxHeaderBytes: 8192}
}
