package authz

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHandler(t *testing.T) {
	st, _ := OpenState("")
	e := NewEngine(Rules{}, st, nil)
	srv := httptest.NewServer(Handler(e, nil))
	defer srv.Close()
	good := `{"apiVersion":"` + APIVersion + `","peer":"10.0.0.1","dnsNames":["w1"],"ipAddresses":["10.0.0.1"]}`
	post := func(body string) (int, string) {
		resp, err := http.Post(srv.URL+DecidePath, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		d, _ := DecodeResponse(resp.Body)
		if d == nil {
			return resp.StatusCode, ""
		}
		return resp.StatusCode, d.Outcome
	}
	if code, _ := post(good); code != http.StatusServiceUnavailable {
		t.Fatalf("before the inventory: %d", code)
	}
	if resp, _ := http.Get(srv.URL + "/healthz"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("healthz before the inventory: %d", resp.StatusCode)
	}
	s, _ := NewSnapshot([]Machine{{Name: "w1", Addresses: addrs("10.0.0.1")}})
	if err := e.SetSnapshot(s); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		body    string
		code    int
		outcome string
	}{
		{good, 200, OutcomeAllowed},
		{strings.Replace(good, "10.0.0.1\"]}", "10.0.0.2\"]}", 1), 200, OutcomeAddressNotOwned},
		{`{"apiVersion":"x"}`, 400, ""},
		{good[:20], 400, ""},
		{`{"apiVersion":"` + APIVersion + `","peer":"10.0.0.1","dnsNames":["` + strings.Repeat("a", MaxMessageBytes) + `"]}`, 400, ""},
	}
	for _, c := range cases {
		if code, outcome := post(c.body); code != c.code || outcome != c.outcome {
			t.Errorf("%.60s: got %d %q, want %d %q", c.body, code, outcome, c.code, c.outcome)
		}
	}
	if resp, _ := http.Get(srv.URL + DecidePath); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET decide: %d", resp.StatusCode)
	}
}
