package attack

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
)

// TestConnectionMemory holds 1,024 connections open at once, each through
// its TLS and HTTP/2 set-up (the state of a worker's connection between
// its handshake and its request), and measures the daemon's memory: the
// peak must stay under 64 MiB, and the bytes per connection are
// reported. The budgets are raised so that all 1,024 stay open.
func TestConnectionMemory(t *testing.T) {
	certs := newCerts(t, "mem")
	d := devtest.StartDaemon(t, daemonBinary(), "TRUSTD_CERT_DIR="+certs, "TRUSTD_MAX_CONNECTIONS=1100",
		"TRUSTD_MAX_UNAUTHENTICATED_CONNECTIONS=1100", "TRUSTD_KNOWN_WORKER_RESERVE=1", "TRUSTD_AUTH_TIMEOUT=60s", "TRUSTD_IDLE_TIMEOUT=60s",
		"TRUSTD_REQUEST_IDLE_TIMEOUT=50s") // no GOAWAY to the idle connections while they are counted
	time.Sleep(time.Second)
	idle := rss(t, d.PID(), "VmRSS")
	resetPeakRSS(t, d.PID())
	const n = 1024
	ctx, cancel := context.WithCancel(context.Background())
	a := &attacker{addr: d.Addr}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := idleConnection(ctx, a, fmt.Sprintf("127.4.%d.%d", i/32, i%32+1)); err != nil && ctx.Err() == nil {
				t.Errorf("connection %d: %v", i, err)
			}
		}()
		if i%32 == 31 {
			time.Sleep(100 * time.Millisecond) // let the handshakes through on a shared machine
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for a.held.Load() < n && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	held, now, peak := a.held.Load(), rss(t, d.PID(), "VmRSS"), rss(t, d.PID(), "VmHWM")
	cancel()
	wg.Wait()
	t.Logf("%d connections held: RSS %.1f MiB (idle %.1f MiB), peak %.1f MiB; %.1f KiB per connection",
		held, mib(now), mib(idle), mib(peak), float64(now-idle)/float64(held)/1024)
	if held < n {
		t.Fatalf("only %d of %d connections were held open at once", held, n)
	}
	if peak >= 64<<20 {
		t.Errorf("peak RSS %.1f MiB with %d connections, want < 64 MiB", mib(peak), n)
	}
}
