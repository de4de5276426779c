package authz

import (
	"bytes"
	"strings"
	"testing"
)

func TestDecodeResponse(t *testing.T) {
	v := `"apiVersion":"` + APIVersion + `"`
	cases := []struct {
		name, body string
		allow      bool
		outcome    string
		err        string
	}{
		{"allow", `{` + v + `,"allow":true,"outcome":"allowed","reason":"ok"}`, true, OutcomeAllowed, ""},
		{"deny", `{` + v + `,"allow":false,"outcome":"denied_pinned","reason":"x"}`, false, OutcomePinned, ""},
		{"unknown denial", `{` + v + `,"allow":false,"outcome":"denied_by_cmdb","reason":"x"}`, false, OutcomeDenied, ""},
		{"allow with a denial outcome", `{` + v + `,"allow":true,"outcome":"denied_pinned"}`, false, "", "contradicts"},
		{"deny with allowed outcome", `{` + v + `,"allow":false,"outcome":"allowed"}`, false, "", "contradicts"},
		{"unknown field", `{` + v + `,"allow":true,"outcome":"allowed","admin":true}`, false, "", "unknown field"},
		{"wrong version", `{"apiVersion":"v0","allow":true,"outcome":"allowed"}`, false, "", "apiVersion"},
		{"trailing", `{` + v + `,"allow":false,"outcome":"denied_pinned"} {}`, false, "", "trailing"},
		{"not JSON", `allow`, false, "", "malformed"},
		{"oversized", `{` + v + `,"allow":false,"outcome":"denied_pinned","reason":"` + strings.Repeat("x", MaxMessageBytes) + `"}`, false, "", "larger than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := DecodeResponse(strings.NewReader(c.body))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("got %+v, %v; want error containing %q", got, err, c.err)
				}
				return
			}
			if err != nil || got.Allow != c.allow || got.Outcome != c.outcome {
				t.Fatalf("got %+v, %v", got, err)
			}
		})
	}
}

func TestDecodeRequest(t *testing.T) {
	good := `{"apiVersion":"` + APIVersion + `","peer":"10.0.0.1","subject":"","dnsNames":["w1"],"ipAddresses":["10.0.0.1"],"csrSHA256":"00","keyType":"Ed25519","tokenIndex":0}`
	if _, err := DecodeRequest(strings.NewReader(good)); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{`{}`, `{"apiVersion":"` + APIVersion + `"}`, good[:len(good)-1], good + good, strings.Replace(good, `"peer"`, `"Peer2"`, 1)} {
		if _, err := DecodeRequest(strings.NewReader(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// FuzzDecodeResponse: no input decodes to an allow unless it says allow
// with the allowed outcome and the current version.
func FuzzDecodeResponse(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"` + APIVersion + `","allow":true,"outcome":"allowed","reason":""}`))
	f.Add([]byte(`{"apiVersion":"` + APIVersion + `","allow":false,"outcome":"x"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeResponse(bytes.NewReader(data))
		if err != nil {
			return
		}
		if r.Allow && (r.Outcome != OutcomeAllowed || r.APIVersion != APIVersion) {
			t.Fatalf("allow from %q: %+v", data, r)
		}
		if !r.Allow && !KnownDenial(r.Outcome) {
			t.Fatalf("unknown denial outcome %q passed", r.Outcome)
		}
	})
}

// FuzzDecodeRequest: a request that decodes never makes Decide panic.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"` + APIVersion + `","peer":"10.0.0.1","dnsNames":["w1"],"ipAddresses":["10.0.0.1"]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeRequest(bytes.NewReader(data))
		if err != nil {
			return
		}
		st, _ := OpenState("")
		e := NewEngine(Rules{DNSPatterns: []string{"*.x"}}, st, nil)
		s, _ := NewSnapshot([]Machine{{Name: "w1", Addresses: addrs("10.0.0.1")}})
		if err := e.SetSnapshot(s); err != nil {
			t.Fatal(err)
		}
		_, _ = e.Decide(r)
	})
}
