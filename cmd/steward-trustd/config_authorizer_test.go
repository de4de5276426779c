package main

import (
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/server"
)

func TestAuthorizerSettings(t *testing.T) {
	cases := []struct {
		name string
		set  map[string]string
		err  string
		kind string
	}{
		{"default none", nil, "", "none"},
		{"file with state", map[string]string{"authorizer": "file:/etc/inv.json", "authorizer-state": "/var/lib/s.json"}, "", "file"},
		{"file without state", map[string]string{"authorizer": "file:/etc/inv.json"}, "TRUSTD_AUTHORIZER_STATE", ""},
		{"state without file", map[string]string{"authorizer": "unix:///run/a.sock", "authorizer-state": "/x"}, "only the built-in", ""},
		{"plain http", map[string]string{"authorizer": "http://authz"}, "plain http is refused", ""},
		{"bad mode", map[string]string{"authorizer": "unix:///run/a.sock", "authorizer-mode": "audit"}, "enforce or observe", ""},
		{"cert without key", map[string]string{"authorizer": "https://a.example", "authorizer-client-cert": "/c.pem"}, "together", ""},
		{"webhook", map[string]string{"authorizer": "https://a.example/v1/decide", "authorizer-mode": "observe", "authorizer-cache-ttl": "0s"}, "", "webhook"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := loadConfig(func(name string) (string, bool) {
				v, ok := c.set[name]
				return v, ok
			})
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("got %v, want an error containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.authz.target.Kind != c.kind || cfg.authz.timeout != 2*time.Second {
				t.Fatalf("%+v", cfg.authz)
			}
			if c.kind == "webhook" && (cfg.authz.mode != server.AuthorizerObserve || cfg.authz.cacheTTL >= 0) {
				t.Fatalf("%+v", cfg.authz)
			}
		})
	}
}
