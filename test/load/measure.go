package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"
)

// bootLog records, per simulated worker (by arrival index), how many
// attempts it made and when it got its certificate: the storm's fairness
// figures (attempts per worker, arrival order kept) come from it.
type bootLog struct {
	start    time.Time
	mu       sync.Mutex
	attempts []int
	finish   []time.Duration // 0: never certified
}

func newBootLog(n int, start time.Time) *bootLog {
	return &bootLog{start: start, attempts: make([]int, n), finish: make([]time.Duration, n)}
}

func (b *bootLog) attempt(i int64) {
	b.mu.Lock()
	b.attempts[i]++
	b.mu.Unlock()
}

func (b *bootLog) certified(i int64) {
	b.mu.Lock()
	b.finish[i] = time.Since(b.start)
	b.mu.Unlock()
}

// report prints attempts per certified worker and the share of worker
// pairs certified in the opposite order to their arrival (random order
// gives one half, first come first served zero).
func (b *bootLog) report(w io.Writer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var attempts []int
	var finishes []time.Duration // in arrival order
	for i, f := range b.finish {
		if f > 0 {
			attempts = append(attempts, b.attempts[i])
			finishes = append(finishes, f)
		}
	}
	if len(attempts) == 0 {
		return
	}
	sort.Ints(attempts)
	pick := func(p float64) int { return attempts[int(float64(len(attempts)-1)*p)] }
	n := int64(len(finishes))
	pairs := n * (n - 1) / 2
	inv := inversions(finishes)
	share := 0.0
	if pairs > 0 {
		share = float64(inv) / float64(pairs)
	}
	fmt.Fprintf(w, "attempts per certified worker: p50=%d p90=%d p99=%d max=%d\n", pick(0.5), pick(0.9), pick(0.99), attempts[len(attempts)-1])
	fmt.Fprintf(w, "order: %.2f%% of worker pairs certified in the opposite order to their arrival (%d of %d)\n", 100*share, inv, pairs)
}

// inversions counts pairs i<j with d[i] > d[j] (merge sort, O(n log n)).
func inversions(d []time.Duration) int64 {
	if len(d) < 2 {
		return 0
	}
	mid := len(d) / 2
	left := append([]time.Duration(nil), d[:mid]...)
	right := append([]time.Duration(nil), d[mid:]...)
	n := inversions(left) + inversions(right)
	i, j, k := 0, 0, 0
	for i < len(left) && j < len(right) {
		if right[j] < left[i] {
			d[k] = right[j]
			n += int64(len(left) - i)
			j++
		} else {
			d[k] = left[i]
			i++
		}
		k++
	}
	k += copy(d[k:], left[i:])
	copy(d[k:], right[j:])
	return n
}

// daemonCounters are the daemon's metrics that judge a storm: issued,
// refused by reason, and signatures made after the request's deadline
// (wasted device work).
var daemonCounters = []string{"trustd_certificates_issued_total", "trustd_requests_denied_total", "trustd_signatures_late_total"}

// checkMetricsURL accepts only http URLs on loopback, like -addr.
func checkMetricsURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" {
		return fmt.Errorf("-metrics %q: want http://127.0.0.1:PORT/metrics", raw)
	}
	a, err := netip.ParseAddr(u.Hostname())
	if err != nil || !a.IsLoopback() {
		return fmt.Errorf("-metrics %q: only loopback addresses", raw)
	}
	return nil
}

// reportDaemonCounters prints the daemon's non-zero counters of interest.
func reportDaemonCounters(w io.Writer, metricsURL string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(metricsURL)
	if err != nil {
		fmt.Fprintf(w, "daemon metrics: %v\n", err)
		return
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 8<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, name := range daemonCounters {
			if strings.HasPrefix(line, name) && !strings.HasSuffix(line, " 0") {
				out = append(out, line)
			}
		}
	}
	fmt.Fprintf(w, "daemon counters: %s\n", strings.Join(out, "; "))
}

// talosRetry waits between a worker's attempts as Talos's RemoteGenerator
// does: go-retry's ExponentialTicker with 1 s units and 100 ms jitter,
// whose n-th tick is Duration((2^n-1)/2) seconds (the float truncated to
// whole units: 0, 1, 3, 7, 15, 31 s) plus jitter, within a one-minute
// budget; after it the secrets controller starts over (a new generator),
// which this models as a fresh schedule after 1 s.
type talosRetry struct {
	cycleStart time.Time
	n          int
}

func newTalosRetry() *talosRetry { return &talosRetry{cycleStart: time.Now()} }

// next is the wait after a failed attempt.
func (t *talosRetry) next() time.Duration {
	if time.Since(t.cycleStart) >= time.Minute {
		t.cycleStart, t.n = time.Now().Add(time.Second), 0
		return time.Second
	}
	t.n++
	return talosWait(t.n)
}

func talosWait(n int) time.Duration {
	units := time.Duration(math.Pow(2, float64(n))-1) / 2
	return units*time.Second + time.Duration(randInt(int64(100*time.Millisecond)))
}
