package cli

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestSplitList(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   []string
		want []string
	}{
		{nil, nil},
		{[]string{""}, nil},
		{[]string{"a"}, []string{"a"}},
		{[]string{"a, b", " ,c,,"}, []string{"a", "b", "c"}},
	} {
		if got := SplitList(tt.in...); fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("SplitList(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestListVarDefault(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{nil, []string{"os:admin"}},
		{[]string{"--roles", "os:reader"}, []string{"os:reader"}},
		{[]string{"--roles", "os:reader", "--roles", "os:etcd:backup"}, []string{"os:reader", "os:etcd:backup"}},
		{[]string{"--roles", ""}, nil},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		var roles []string
		ListVar(fs, &roles, "roles", []string{"os:admin"}, "roles")
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(roles) != fmt.Sprint(tt.want) {
			t.Errorf("%q: roles %q, want %q", tt.args, roles, tt.want)
		}
	}
}

func TestBoundedFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args    []string
		hours   time.Duration
		timeout time.Duration
		err     string
	}{
		{nil, 87600 * time.Hour, 10 * time.Second, ""},
		{[]string{"--hours", "1"}, time.Hour, 10 * time.Second, ""},
		{[]string{"--hours", "175200"}, 175200 * time.Hour, 10 * time.Second, ""},
		{[]string{"--hours", "175201"}, 0, 0, `invalid argument "175201" for "--hours" flag: must be 1 to 175200 hours (20 years)`},
		{[]string{"--hours", "2562047"}, 0, 0, "must be 1 to 175200"},
		{[]string{"--hours", "2562048"}, 0, 0, "must be 1 to 175200"},
		{[]string{"--hours", "99999999999999999999"}, 0, 0, "not a whole number"},
		{[]string{"--hours", "-1"}, 0, 0, "must be 1 to"},
		{[]string{"--hours", "1.5"}, 0, 0, "not a whole number"},
		{[]string{"--timeout", "1m"}, 87600 * time.Hour, time.Minute, ""},
		{[]string{"--timeout", "0s"}, 0, 0, `"--timeout" flag: must be 100ms to 5m0s`},
		{[]string{"--timeout", "6m"}, 0, 0, "must be 100ms to 5m0s"},
		{[]string{"--timeout", "ten"}, 0, 0, `invalid duration "ten"`},
	}
	for _, tt := range tests {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		var hours, timeout time.Duration
		HoursVar(fs, &hours, "hours", 87600, MaxCAHours, "validity")
		DurationVar(fs, &timeout, "timeout", 10*time.Second, 100*time.Millisecond, 5*time.Minute, "timeout")
		err := fs.Parse(tt.args)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: error %v, want %q", tt.args, err, tt.err)
			}
			continue
		}
		if err != nil || hours != tt.hours || timeout != tt.timeout {
			t.Errorf("%q: %v %v %v, want %v %v", tt.args, err, hours, timeout, tt.hours, tt.timeout)
		}
	}
}

func TestHoursUsageNamesBound(t *testing.T) {
	t.Parallel()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	var d time.Duration
	HoursVar(fs, &d, "hours", 8760, MaxLeafHours, "validity in hours")
	if u := fs.FlagUsages(); !strings.Contains(u, "1 to 87600 hours (10 years) (default 8760)") {
		t.Errorf("usage %q", u)
	}
}

func TestPCRsVar(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		arg  string
		want []int
		err  string
	}{
		{"7", []int{7}, ""},
		{"11,7", []int{7, 11}, ""},
		{"0,19", []int{0, 19}, ""},
		{"7,16", nil, "PCR 16 is the debug PCR"},
		{"23", nil, "PCR 23 is the application PCR"},
		{"24", nil, "not a PCR index 0-23"},
		{"7,7", nil, "PCR 7 given twice"},
		{"7,", nil, "not a PCR index"},
		{" 7, 11 ", []int{7, 11}, ""},
		{"7,,11", nil, "not a PCR index"},
		{"", nil, "not a PCR index"},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		var pcrs []int
		PCRsVar(fs, &pcrs, "pcrs", "PCRs")
		err := fs.Parse([]string{"--pcrs", tt.arg})
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), `"--pcrs"`) {
				t.Errorf("%q: error %v, want %q", tt.arg, err, tt.err)
			}
			continue
		}
		if err != nil || fmt.Sprint(pcrs) != fmt.Sprint(tt.want) {
			t.Errorf("%q: %v %v", tt.arg, pcrs, err)
		}
	}
}

func TestRequired(t *testing.T) {
	t.Parallel()
	if err := Required(map[string]string{"a": "x"}); err != nil {
		t.Error(err)
	}
	err := Required(map[string]string{"signer": "", "out": "", "ca": "x"})
	if err == nil || err.Error() != "required flag(s) --out, --signer not set" || ExitCode(err) != ExitUsage {
		t.Errorf("%v", err)
	}
}
