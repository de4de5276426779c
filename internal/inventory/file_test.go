package inventory

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/authz"
)

const v = `"apiVersion":"` + FileVersion + `"`

func TestParseFile(t *testing.T) {
	cases := []struct{ name, body, err string }{
		{"good", `{` + v + `,"rules":{"extraCIDRs":["fdcc::/16"],"dnsPatterns":["{name}.example.com","*.w.example.com"],"joinWindow":"30m"},"machines":[{"name":"w1","addresses":["10.0.0.1","fd00::1"],"hostnames":["w1.lan"],"certSANs":["x"],"uuid":"u","created":"2026-12-03T12:00:00Z"}]}`, ""},
		{"empty", `{` + v + `,"machines":[]}`, ""},
		{"unknown field", `{` + v + `,"machines":[{"name":"w1","addresses":[],"adress":"x"}]}`, "unknown field"},
		{"version", `{"apiVersion":"v0","machines":[]}`, "apiVersion"},
		{"trailing", `{` + v + `,"machines":[]}{}`, "trailing"},
		{"bad address", `{` + v + `,"machines":[{"name":"w1","addresses":["10.0.0.256"]}]}`, `machines[0] ("w1"): address`},
		{"zone", `{` + v + `,"machines":[{"name":"w1","addresses":["fe80::1%eth0"]}]}`, "not an IP address"},
		{"no name", `{` + v + `,"machines":[{"addresses":["10.0.0.1"]}]}`, "no name"},
		{"duplicate", `{` + v + `,"machines":[{"name":"a","addresses":[]},{"name":"a","addresses":[]}]}`, "twice"},
		{"bad created", `{` + v + `,"machines":[{"name":"a","addresses":[],"created":"yesterday"}]}`, "RFC 3339"},
		{"bad cidr", `{` + v + `,"rules":{"extraCIDRs":["10.0.0.0/33"]},"machines":[]}`, "not a CIDR"},
		{"every address", `{` + v + `,"rules":{"extraCIDRs":["::/0"]},"machines":[]}`, "every address"},
		{"bare wildcard", `{` + v + `,"rules":{"dnsPatterns":["*"]},"machines":[]}`, "wildcard"},
		{"tld wildcard", `{` + v + `,"rules":{"dnsPatterns":["*.com"]},"machines":[]}`, "two labels"},
		{"bad window", `{` + v + `,"rules":{"joinWindow":"soon"},"machines":[]}`, "joinWindow"},
		{"oversized", `{` + v + `,"machines":[],"x":"` + strings.Repeat("a", MaxFileBytes) + `"}`, "limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := ParseFile([]byte(c.body))
			if c.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("got %+v, %v; want an error containing %q", p, err, c.err)
			}
		})
	}
}

func TestFileSourceReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inventory.json")
	write := func(body string) {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`{` + v + `,"machines":[{"name":"w1","addresses":["10.0.0.1"]}]}`)
	st, _ := authz.OpenState("")
	e := authz.NewEngine(authz.Rules{}, st, nil)
	var reloads []error
	src := &FileSource{Path: path, OnReload: func(err error) { reloads = append(reloads, err) }}
	if err := src.Load(Install(e, authz.Rules{})); err != nil {
		t.Fatal(err)
	}
	decide := func(peer, name string) string {
		r, err := e.Decide(&authz.Request{APIVersion: authz.APIVersion, Peer: peer, DNSNames: []string{name}, IPAddresses: []string{peer}})
		if err != nil {
			t.Fatal(err)
		}
		return r.Outcome
	}
	if got := decide("10.0.0.2", "w2"); got != authz.OutcomeUnknownMachine {
		t.Fatalf("before reload: %s", got)
	}
	write(`{` + v + `,"machines":[{"name":"w1","addresses":["10.0.0.1"]},{"name":"w2","addresses":["10.0.0.2"]}]}`)
	src.tick()
	if got := decide("10.0.0.2", "w2"); got != authz.OutcomeAllowed {
		t.Fatalf("after reload: %s", got)
	}
	write(`{` + v + `,"machines":[{"name":"w1","addresses":["10.0.0.1"]},`) // broken: the last good stays
	src.tick()
	src.tick()
	if got := decide("10.0.0.1", "w1"); got != authz.OutcomeAllowed {
		t.Fatalf("broken file replaced the inventory: %s", got)
	}
	if len(reloads) != 3 || reloads[0] != nil || reloads[1] == nil {
		t.Fatalf("reload outcomes: %v", reloads)
	}
}

func TestMergeRules(t *testing.T) {
	a := authz.Rules{DNSPatterns: []string{"a"}, JoinWindow: time.Minute}
	got := MergeRules(a, authz.Rules{DNSPatterns: []string{"b"}, JoinWindow: time.Hour})
	if strings.Join(got.DNSPatterns, ",") != "a,b" || got.JoinWindow != time.Hour {
		t.Fatalf("%+v", got)
	}
	if got := MergeRules(a, authz.Rules{}); got.JoinWindow != time.Minute {
		t.Fatalf("%+v", got)
	}
}

// FuzzParseFile: every inventory that parses gives a snapshot whose
// machines all have names and valid addresses.
func FuzzParseFile(f *testing.F) {
	f.Add([]byte(`{` + v + `,"machines":[{"name":"w1","addresses":["10.0.0.1"]}]}`))
	f.Add([]byte(`{` + v + `,"rules":{"dnsPatterns":["*.a.b"]},"machines":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseFile(data)
		if err != nil {
			return
		}
		for _, m := range p.Snapshot.Machines() {
			if m.Name == "" {
				t.Fatal("machine without a name")
			}
			for _, a := range m.Addresses {
				if !a.IsValid() {
					t.Fatal("invalid address")
				}
			}
		}
	})
}
