package pki

import (
	"strings"
	"testing"
)

func TestCheckDNSName(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 63)
	tests := []struct {
		name        string
		own, worker bool // accepted under OwnName, under WorkerName
	}{
		{"worker-1", true, true},
		{"API.Example.com", true, true},
		{long + ".example", true, true},
		{"ip-10-0-0-1_ec2", false, true},                 // cloud host names carry '_'
		{"_acme.example", false, true},                   //
		{"worker-1.example.", false, true},               // fully qualified
		{"worker-1.example..", false, false},             // one trailing dot only
		{".", false, false},                              //
		{"", false, false},                               //
		{"*.example", false, false},                      // no wildcards, ever
		{"a.*.example", false, false},                    //
		{"a..b", false, false},                           // empty label
		{"-a.example", false, false},                     // leading '-'
		{"a-.example", false, false},                     // trailing '-'
		{long + "a.example", false, false},               // 64-character label
		{strings.Repeat("a.", 127) + "ab", false, false}, // 256 characters
		{"a b", false, false},                            //
		{"bücher.example", false, false},                 // IDNs go in as A-labels (xn--)
		{"xn--bcher-kva.example", true, true},            //
		{"10.0.0.1", true, true},                         // digits are a label too; callers try IP first
	}
	for _, tt := range tests {
		for _, c := range []struct {
			rule NameRule
			want bool
		}{{OwnName, tt.own}, {WorkerName, tt.worker}} {
			err := CheckDNSName(tt.name, c.rule)
			if (err == nil) != c.want {
				t.Errorf("CheckDNSName(%q, %d) = %v, want ok=%v", tt.name, c.rule, err, c.want)
			}
		}
	}
}

func TestSplitHosts(t *testing.T) {
	t.Parallel()
	ips, dns, err := SplitHosts([]string{" 10.0.0.1 ", "", "API.example.com", "fd00::1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ips) != 2 || !ips[1].Equal([]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}) {
		t.Errorf("ips %v", ips)
	}
	if strings.Join(dns, ",") != "api.example.com" {
		t.Errorf("dns %v, want lower case", dns)
	}
	for _, bad := range []string{"bad host", "node_1.example", "node.example.", "*.example"} {
		if _, _, err := SplitHosts([]string{bad}); err == nil {
			t.Errorf("SplitHosts(%q) accepted a name we would put into our own certificate", bad)
		}
	}
}
