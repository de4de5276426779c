package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestInversions(t *testing.T) {
	cases := []struct {
		d    []time.Duration
		want int64
	}{
		{nil, 0},
		{[]time.Duration{1, 2, 3, 4}, 0},
		{[]time.Duration{4, 3, 2, 1}, 6},
		{[]time.Duration{2, 1, 4, 3}, 2},
		{[]time.Duration{1, 1, 1}, 0},
	}
	for _, c := range cases {
		if got := inversions(append([]time.Duration(nil), c.d...)); got != c.want {
			t.Errorf("inversions(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

func TestBootLogReport(t *testing.T) {
	b := newBootLog(4, time.Now())
	for i, n := range []int{1, 3, 1, 2} {
		for j := 0; j < n; j++ {
			b.attempt(int64(i))
		}
	}
	b.finish = []time.Duration{10, 30, 20, 0} // worker 3 never certified
	var out bytes.Buffer
	b.report(&out)
	for _, want := range []string{"p50=1 ", "max=3", "33.33%", "(1 of 3)"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestMetricsURLLoopbackOnly(t *testing.T) {
	for raw, ok := range map[string]bool{
		"http://127.0.0.1:9100/metrics": true,
		"http://[::1]:9100/metrics":     true,
		"http://10.0.0.1:9100/metrics":  false,
		"https://127.0.0.1/metrics":     false,
		"http://example.com/metrics":    false,
	} {
		if err := checkMetricsURL(raw); (err == nil) != ok {
			t.Errorf("%s: %v, want ok=%v", raw, err, ok)
		}
	}
}

func TestTalosWait(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 0, 2: time.Second, 3: 3 * time.Second, 4: 7 * time.Second, 6: 31 * time.Second} {
		if got := talosWait(n); got < want || got >= want+100*time.Millisecond {
			t.Errorf("talosWait(%d) = %v, want %v plus up to 100ms jitter", n, got, want)
		}
	}
}
