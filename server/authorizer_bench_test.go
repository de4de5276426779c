package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"

	"github.com/steward-trustd/steward-trustd/internal/authz"
	"github.com/steward-trustd/steward-trustd/internal/inventory"
	"github.com/steward-trustd/steward-trustd/signer"
)

// benchClients is the number of concurrent workers of the benchmarks.
const benchClients = 32

// benchInventory lists n machines w<i> at 10.0.<i/256>.<i%256>.
func benchInventory(n int) string {
	var b strings.Builder
	b.WriteString(`{"apiVersion":"` + inventory.FileVersion + `","machines":[`)
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"name":"w%d","addresses":["10.0.%d.%d"]}`, i, i/256, i%256)
	}
	b.WriteString("]}")
	return b.String()
}

// BenchmarkCertificateHandlerAuthorizer is BenchmarkCertificateHandler at
// 32 concurrent clients (each its own machine and address), with the
// authorizer off and with the built-in file authorizer (5000 machines,
// the allow cache off so that every request is decided). decision-p99-ms
// is the 99th percentile of the decision alone.
func BenchmarkCertificateHandlerAuthorizer(b *testing.B) {
	for _, mode := range []string{"off", "file", "unix"} {
		b.Run("authorizer="+mode, func(b *testing.B) {
			ca := newTestCA(b, signer.ECDSAP256)
			cfg := Config{Signer: ca.signer, Credentials: ca.credentials(b, testToken), Audit: slog.New(slog.DiscardHandler), RateLimits: RateLimits{PerPeerRate: -1, MaxSignerQueue: 4096}}
			var lat *latencies
			switch mode {
			case "file":
				cfg.Authorizer, lat = benchFileAuthorizer(b)
			case "unix":
				cfg.Authorizer, lat = benchUnixAuthorizer(b)
			}
			svc, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			runParallelClients(b, svc, lat)
			if lat != nil {
				b.ReportMetric(lat.p99().Seconds()*1000, "decision-p99-ms")
			}
		})
	}
}

// runParallelClients pins each client's address (untimed), then has 32
// clients ask for certificates concurrently.
func runParallelClients(b *testing.B, svc *Service, lat *latencies) {
	reqs := make([]*securityapi.CertificateRequest, benchClients)
	for i := range reqs {
		reqs[i] = &securityapi.CertificateRequest{Csr: makeCSR(b, csrSpec{key: newKey(b, "p256"), dns: []string{fmt.Sprintf("w%d", i)}, ips: []net.IP{net.IPv4(10, 0, 0, byte(i))}})}
	}
	// Each machine's first certificate pins its address (a state write
	// with fsync): done before timing, as renewals are what a running
	// cluster asks for.
	for i, r := range reqs {
		if _, err := svc.Certificate(ctxFrom(fmt.Sprintf("10.0.0.%d", i)), r); err != nil {
			b.Fatal(err)
		}
	}
	if lat != nil {
		lat.reset()
	}
	var next atomic.Int32
	b.SetParallelism((benchClients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(1)-1) % benchClients
		ctx := ctxFrom(fmt.Sprintf("10.0.0.%d", i))
		for pb.Next() {
			if _, err := svc.Certificate(ctx, reqs[i]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// latencies collects decision durations.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) reset() {
	l.mu.Lock()
	l.d = l.d[:0]
	l.mu.Unlock()
}

func (l *latencies) p99() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	slices.Sort(l.d)
	return l.d[len(l.d)*99/100]
}

// timedDecider measures its decider's calls.
type timedDecider struct {
	Decider
	lat *latencies
}

// Decide implements Decider.
func (t *timedDecider) Decide(ctx context.Context, req *authz.Request) (*authz.Response, error) {
	start := time.Now()
	resp, err := t.Decider.Decide(ctx, req)
	d := time.Since(start)
	t.lat.mu.Lock()
	t.lat.d = append(t.lat.d, d)
	t.lat.mu.Unlock()
	return resp, err
}

func benchFileAuthorizer(b *testing.B) (*Authorizer, *latencies) {
	dir := b.TempDir()
	fd, err := NewFileDecider(writeBenchInventory(b, dir), filepath.Join(dir, "state.json"), nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	lat := &latencies{}
	a, err := NewAuthorizer(AuthorizerConfig{Decider: &timedDecider{Decider: fd, lat: lat}, CacheTTL: -1, MaxConcurrent: 64})
	if err != nil {
		b.Fatal(err)
	}
	return a, lat
}

// benchUnixAuthorizer is the webhook path as the authorizer container
// serves it: the same inventory behind authz.Handler (what
// steward-trustd-authorizer serve runs, whatever its sources) on a unix
// socket, asked through the daemon's webhook client.
func benchUnixAuthorizer(b *testing.B) (*Authorizer, *latencies) {
	dir := b.TempDir()
	fd, err := NewFileDecider(writeBenchInventory(b, dir), filepath.Join(dir, "state.json"), nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	sock := filepath.Join(dir, "authz.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: authz.Handler(fd.engine, slog.New(slog.DiscardHandler)), ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(l) }()
	b.Cleanup(func() { _ = srv.Close() })
	wh, err := NewWebhook("unix://"+sock, WebhookTLS{})
	if err != nil {
		b.Fatal(err)
	}
	lat := &latencies{}
	a, err := NewAuthorizer(AuthorizerConfig{Decider: &timedDecider{Decider: wh, lat: lat}, CacheTTL: -1, MaxConcurrent: 64})
	if err != nil {
		b.Fatal(err)
	}
	return a, lat
}

// writeBenchInventory writes the 5000-machine inventory into dir.
func writeBenchInventory(b *testing.B, dir string) string {
	path := filepath.Join(dir, "inventory.json")
	if err := os.WriteFile(path, []byte(benchInventory(5000)), 0o600); err != nil {
		b.Fatal(err)
	}
	return path
}

// BenchmarkFileDecision is one decision of the built-in file authorizer
// (5000 machines, a renewal: the address already pinned), without the
// handler: its CPU cost.
func BenchmarkFileDecision(b *testing.B) {
	a, _ := benchFileAuthorizer(b)
	r := &Request{DNSNames: []string{"w7"}, IPs: []net.IP{net.IPv4(10, 0, 0, 7)}, Requested: []string{"w7", "10.0.0.7"}}
	peer := addr("10.0.0.7")
	if err := a.check(b.Context(), r, peer, 0, "", &authzRecord{}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := a.check(b.Context(), r, peer, 0, "", &authzRecord{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUnixDecision is one decision through the webhook client and
// the authorizer's handler on a unix socket, one at a time: the round
// trip a request adds when the machine is not busy signing.
func BenchmarkUnixDecision(b *testing.B) {
	a, lat := benchUnixAuthorizer(b)
	r := &Request{DNSNames: []string{"w7"}, IPs: []net.IP{net.IPv4(10, 0, 0, 7)}, Requested: []string{"w7", "10.0.0.7"}}
	peer := addr("10.0.0.7")
	if err := a.check(b.Context(), r, peer, 0, "", &authzRecord{}); err != nil {
		b.Fatal(err)
	}
	lat.reset()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := a.check(b.Context(), r, peer, 0, "", &authzRecord{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(lat.p99().Seconds()*1000, "decision-p99-ms")
}
