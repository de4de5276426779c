package server

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v4"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/signer"
)

const alertsDir = "../deploy/prometheus"

// TestAlertRules evaluates deploy/prometheus/alerts.yaml against the
// recorded samples of alerts_test.yaml with Prometheus's own rule engine
// (promtool, Debian's prometheus package): every alert fires where it
// must and stays quiet where it must not.
func TestAlertRules(t *testing.T) {
	promtool := devtest.NeedTool(t, "promtool")
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = alertsDir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestAlertMetricsExistAtStart: every series an alert selects exists from
// the daemon's start (counters at 0), so increase() and rate() see the
// first event and no alert waits for a series to appear.
func TestAlertMetricsExistAtStart(t *testing.T) {
	have := startMetrics(t)
	for _, sel := range alertSelectors(t) {
		for _, want := range sel.series() {
			if !have[want] {
				t.Errorf("alert selector %s: no series %s at start", sel.text, want)
			}
		}
	}
}

// startMetrics returns "name" and "name{label=value}" for every series of
// a fresh daemon's registry (both signer kinds, connection limits set as
// the front door sets them when it starts listening), failing t if a
// counter is not at 0.
func startMetrics(t *testing.T) map[string]bool {
	have := map[string]bool{}
	for _, extractable := range []bool{false, true} {
		reg := prometheus.NewRegistry()
		m := NewMetrics(reg, "tpm", extractable)
		m.setConnLimits(ConnLimits{MaxConnections: 256, MaxUnauthenticated: 128, MaxPerAddress: 64})
		m.SetTokens(nil, []string{"9f86d081884c7d65"}) // as New does for the token file
		registerIssuerExpiry(t, reg)
		NewAuthorizerMetrics(reg) // as the daemon does when TRUSTD_AUTHORIZER is set
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			have[f.GetName()] = true
			for _, s := range f.GetMetric() {
				if c := s.GetCounter(); c != nil && c.GetValue() != 0 {
					t.Errorf("%s starts at %v", f.GetName(), c.GetValue())
				}
				addLabels(have, f.GetName(), s.GetLabel())
			}
		}
	}
	return have
}

// registerIssuerExpiry registers trustd_issuer_expiry_seconds on reg as
// the daemon does at start, for a service on a test CA.
func registerIssuerExpiry(t *testing.T, reg prometheus.Registerer) {
	ca := newTestCA(t, signer.ECDSAP256)
	svc, err := New(Config{Signer: ca.signer, Credentials: ca.credentials(t, "token")})
	if err != nil {
		t.Fatal(err)
	}
	RegisterIssuerExpiry(reg, svc, nil)
}

func addLabels(have map[string]bool, name string, labels []*dto.LabelPair) {
	for _, l := range labels {
		have[name+"{"+l.GetName()+"="+l.GetValue()+"}"] = true
	}
}

// selector is one metric selector of an alert expression.
type selector struct {
	text, name string
	matchers   [][2]string // label, value (alternatives of =~ split)
}

// series lists what must exist for the selector to match at start.
func (s selector) series() []string {
	out := []string{s.name}
	for _, m := range s.matchers {
		out = append(out, s.name+"{"+m[0]+"="+m[1]+"}")
	}
	return out
}

var (
	selectorRE = regexp.MustCompile(`(trustd_[a-z_]+)(\{[^}]*\})?`)
	matcherRE  = regexp.MustCompile(`([a-z_]+)\s*(=~|=)\s*"([^"]*)"`)
)

// alertSelectors reads every metric selector of alerts.yaml.
func alertSelectors(t *testing.T) []selector {
	data, err := os.ReadFile(alertsDir + "/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	var sels []selector
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			for _, m := range selectorRE.FindAllStringSubmatch(r.Expr, -1) {
				sels = append(sels, parseSelector(m[0], m[1], m[2]))
			}
		}
	}
	if len(sels) < 17 {
		t.Fatalf("only %d selectors in alerts.yaml", len(sels))
	}
	return sels
}

func parseSelector(text, name, braces string) selector {
	s := selector{text: text, name: name}
	for _, m := range matcherRE.FindAllStringSubmatch(braces, -1) {
		values := []string{m[3]}
		if m[2] == "=~" {
			values = strings.Split(m[3], "|")
		}
		for _, v := range values {
			s.matchers = append(s.matchers, [2]string{m[1], v})
		}
	}
	return s
}

// TestEveryAlertTested: each alert of alerts.yaml has a promtool case in
// alerts_test.yaml, so a new rule cannot ship without recorded samples.
func TestEveryAlertTested(t *testing.T) {
	rules, err := os.ReadFile(alertsDir + "/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cases, err := os.ReadFile(alertsDir + "/alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tested := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)alertname: (\w+)$`).FindAllSubmatch(cases, -1) {
		tested[string(m[1])] = true
	}
	names := regexp.MustCompile(`(?m)- alert: (\w+)$`).FindAllSubmatch(rules, -1)
	if len(names) == 0 {
		t.Fatal("no alert in alerts.yaml")
	}
	for _, m := range names {
		if !tested[string(m[1])] {
			t.Errorf("alert %s has no case in alerts_test.yaml", m[1])
		}
	}
}
