// Command load simulates Talos workers asking steward-trustd for their apid
// certificate: each simulated worker makes a fresh key, CSR and TLS
// connection, as a real worker does at every attempt window. It reports
// certificates per second, latency percentiles and errors by gRPC code.
//
// It only targets loopback addresses, and every run is bounded in requests
// and in time.
//
//	go run ./test/load -addr 127.0.0.1:50001 -certs .local/certs -workers 32 -requests 2000
//	go run ./test/load ... -workers 5000 -requests 5000 -ramp 10s -retry   # fleet boot
package main

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/workerclient"
)

type options struct {
	addr       string
	certs      string
	workers    int
	requests   int
	duration   time.Duration
	ramp       time.Duration
	retry      bool
	keyType    string
	print      bool
	rssPID     int
	reqTimeout time.Duration
	reuse      bool
	sources    bool
	metrics    string
	backoff    string
	anchor     bool
	light      bool
	cpuBound   bool
}

// lightWorkers is -light's default number of kept-alive connections.
const lightWorkers = 32

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseOptions(args, stderr)
	if err != nil {
		return 2
	}
	if err := o.validate(); err != nil {
		fmt.Fprintln(stderr, "load:", err)
		return 2
	}
	switch {
	case o.anchor:
		return runAnchor(o, stderr)
	case o.cpuBound:
		return exitStatus(runCPUBound(o, stdout), stderr)
	}
	res, err := runLoadOrLight(o, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "load:", err)
		return 1
	}
	res.report(stdout, o)
	if res.issued < o.requests {
		return 1
	}
	return 0
}

// parseOptions parses the command line; flag errors are printed to stderr.
func parseOptions(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.addr, "addr", "127.0.0.1:50001", "trustd address (loopback only)")
	fs.StringVar(&o.certs, "certs", ".local/certs", "directory with token and os-ca.crt (and accepted-cas.crt)")
	fs.IntVar(&o.workers, "workers", 8, "simulated workers running at once")
	fs.IntVar(&o.requests, "requests", 100, "certificates to obtain in total (one per simulated worker boot)")
	fs.DurationVar(&o.duration, "duration", 5*time.Minute, "hard bound on the whole run")
	fs.DurationVar(&o.ramp, "ramp", 0, "spread worker arrivals evenly over this time (fleet power-up), instead of all at once")
	fs.BoolVar(&o.retry, "retry", false, "retry like a Talos worker until a certificate arrives (counting each failed attempt)")
	fs.StringVar(&o.keyType, "key", "p256", "worker key: p256 (Talos 1.10+ under an ECDSA CA) or ed25519 (Talos 1.9)")
	fs.BoolVar(&o.print, "print", false, "print each issued certificate's subject, SANs and validity")
	fs.IntVar(&o.rssPID, "daemon-pid", 0, "report this process's peak RSS (VmHWM) at the end, and with -light its CPU time per certificate (the server's cost, robust on a shared machine)")
	fs.DurationVar(&o.reqTimeout, "timeout", 10*time.Second, "per-attempt timeout (Talos uses 10s)")
	fs.BoolVar(&o.reuse, "reuse", false, "keep one connection per concurrent client (measures issuance, not TLS handshakes)")
	fs.BoolVar(&o.sources, "spread-sources", false, "give each simulated worker its own 127.x.y.z source address, as a fleet has (per-address rate limits apply per worker)")
	fs.StringVar(&o.backoff, "backoff", "fast", "with -retry, the wait between attempts: fast (250 ms doubling up to 4 s) or talos (Talos's RemoteGenerator: go-retry Exponential in 1 s units, 100 ms jitter: 0, 1, 3, 7, 15, 31 s)")
	fs.BoolVar(&o.anchor, "serve-anchor", false, "instead of loading, serve a bare Talos-style SecurityService (Talos trustd's per-request work with the file key in -certs: os-ca.key, server.crt/.key, token) on -addr until -duration or SIGINT, as the yardstick for the daemon's file path")
	fs.BoolVar(&o.light, "light", false, "light client: make all CSRs and open -workers kept-alive connections (default 32) before the clock starts, then send nothing but requests; only each connection's first response is fully checked")
	fs.BoolVar(&o.cpuBound, "cpu-bound", false, "instead of loading, measure the local CPU bound in-process on all cores: -requests times parse and verify a CSR, sign it with the file key in -certs (os-ca.key) and x509's check of the signature")
	fs.StringVar(&o.metrics, "metrics", "", "the daemon's metrics URL (http://127.0.0.1:PORT/metrics): report its issued, refused and late-signature counters at the end")
	if err := fs.Parse(args); err != nil {
		return o, fmt.Errorf("flags: %w", err)
	}
	if o.light && !flagSet(fs, "workers") {
		o.workers = lightWorkers
	}
	return o, nil
}

func (o *options) validate() error {
	host, _, err := net.SplitHostPort(o.addr)
	if err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	a, err := netip.ParseAddr(host)
	if err != nil || !a.IsLoopback() {
		return fmt.Errorf("-addr %s: only loopback addresses are load-tested", o.addr)
	}
	if o.workers < 1 || o.requests < 1 {
		return errors.New("-workers and -requests must be at least 1")
	}
	if o.duration <= 0 || o.duration > time.Hour {
		return errors.New("-duration must be in (0, 1h]")
	}
	if _, err := workerclient.ParseKeyType(o.keyType); err != nil {
		return fmt.Errorf("-key: %w", err)
	}
	if o.backoff != "" && o.backoff != "fast" && o.backoff != "talos" {
		return fmt.Errorf("-backoff %q: want fast or talos", o.backoff)
	}
	if err := o.validateLight(); err != nil {
		return err
	}
	if o.metrics != "" {
		return checkMetricsURL(o.metrics)
	}
	return nil
}

// validateLight refuses what a -light run cannot do: it has no arrivals,
// retries or per-worker addresses, and makes every CSR up front.
func (o *options) validateLight() error {
	if !o.light && !o.cpuBound {
		return nil
	}
	if o.light && (o.ramp > 0 || o.retry || o.sources) {
		return errors.New("-light measures steady requests: drop -ramp, -retry and -spread-sources")
	}
	if o.requests > maxLightRequests {
		return fmt.Errorf("-requests %d: -light and -cpu-bound make every CSR first, at most %d", o.requests, maxLightRequests)
	}
	return nil
}

// flagSet reports whether name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func exitStatus(err error, stderr io.Writer) int {
	if err != nil {
		fmt.Fprintln(stderr, "load:", err)
		return 1
	}
	return 0
}

func runLoadOrLight(o options, stdout io.Writer) (*result, error) {
	if o.light {
		return runLight(o)
	}
	return runLoad(o, stdout)
}

type result struct {
	mu        sync.Mutex
	latencies []time.Duration // of successful attempts
	boots     []time.Duration // arrival to certificate, per worker
	codes     map[codes.Code]int
	issued    int
	elapsed   time.Duration
	serverCPU time.Duration // -light with -daemon-pid: the server's CPU time in the measured window
	bootLog   *bootLog
}

func (r *result) addErr(c codes.Code) {
	r.mu.Lock()
	r.codes[c]++
	r.mu.Unlock()
}

func runLoad(o options, stdout io.Writer) (*result, error) {
	dir := certdir.OSDir(o.certs)
	token, err := dir.ReadFile(certdir.FileToken)
	if err != nil {
		return nil, fmt.Errorf("worker token: %w", err)
	}
	// A worker trusts machine.ca and machine.acceptedCAs: the cert dir's
	// os-ca.crt and accepted-cas.crt.
	_, bundle, err := certdir.ReadBundle(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.certs, err)
	}
	host, _, _ := net.SplitHostPort(o.addr)
	tlsCfg := workerclient.TLSConfig(workerclient.Roots(bundle...), host)
	ctx, cancel := context.WithTimeout(context.Background(), o.duration)
	defer cancel()

	start := time.Now()
	res := &result{codes: map[codes.Code]int{}, bootLog: newBootLog(o.requests, start)}
	f := &fleet{o: o, tlsCfg: tlsCfg, token: strings.TrimSpace(string(token)), res: res, stdout: stdout, start: start}
	var wg sync.WaitGroup
	for w := 0; w < o.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.client(ctx)
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(f.start)
	return res, nil
}

// fleet is the simulated workers of one run: concurrent clients take
// the next worker boot until o.requests have been taken.
type fleet struct {
	o      options
	tlsCfg *tls.Config
	token  string
	res    *result
	stdout io.Writer
	start  time.Time
	next   atomic.Int64
}

// client is one concurrent client: it boots workers one after another,
// each at its arrival time when the run has a ramp.
func (f *fleet) client(ctx context.Context) {
	var kept *grpc.ClientConn // with -reuse: this client's connection
	defer func() {
		if kept != nil {
			kept.Close()
		}
	}()
	for {
		i := f.next.Add(1) - 1
		if i >= int64(f.o.requests) || ctx.Err() != nil || !f.arrive(ctx, i) {
			return
		}
		var source netip.Addr
		if f.o.sources {
			source = sourceFor(i)
		}
		boot(ctx, f.o, f.tlsCfg, source, f.token, f.res, f.stdout, &kept, i)
	}
}

// arrive waits for worker i's arrival time on the ramp; false if the run
// ended first.
func (f *fleet) arrive(ctx context.Context, i int64) bool {
	if f.o.ramp <= 0 {
		return true
	}
	arrival := f.start.Add(time.Duration(int64(f.o.ramp) * i / int64(f.o.requests)))
	select {
	case <-time.After(time.Until(arrival)):
		return true
	case <-ctx.Done():
		return false
	}
}

// boot is one worker obtaining its certificate: a fresh key and CSR, and
// per attempt a fresh connection, retried with Talos-like backoff if asked.
func boot(ctx context.Context, o options, tlsCfg *tls.Config, source netip.Addr, token string, res *result, stdout io.Writer, kept **grpc.ClientConn, idx int64) {
	arrived := time.Now()
	ip := net.IPv4(127, 0, 0, 1)
	if source.IsValid() {
		ip = source.AsSlice()
	}
	_, csr, err := newCSR(workerclient.KeyType(o.keyType), ip)
	if err != nil {
		res.addErr(codes.Internal)
		return
	}
	backoff := 250 * time.Millisecond
	talos := newTalosRetry()
	for {
		t0 := time.Now()
		conn := *kept
		if conn == nil {
			conn, err = dial(o, tlsCfg, source)
			if err != nil {
				res.addErr(codes.Internal)
				return
			}
		}
		res.bootLog.attempt(idx)
		resp, err := attempt(ctx, o, conn, token, csr)
		if o.reuse {
			*kept = conn
		} else {
			conn.Close()
		}
		if err == nil {
			res.bootLog.certified(idx)
			lat := time.Since(t0)
			res.mu.Lock()
			res.issued++
			res.latencies = append(res.latencies, lat)
			res.boots = append(res.boots, time.Since(arrived))
			res.mu.Unlock()
			if o.print {
				printCert(stdout, resp)
			}
			return
		}
		res.addErr(status.Code(err))
		if !o.retry || ctx.Err() != nil {
			return
		}
		wait := backoff + time.Duration(randInt(int64(backoff)))
		if o.backoff == "talos" {
			wait = talos.next()
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
		if backoff < 4*time.Second {
			backoff *= 2
		}
	}
}

// dial opens a connection to the daemon, from source when it is valid.
func dial(o options, tlsCfg *tls.Config, source netip.Addr) (*grpc.ClientConn, error) {
	if !source.IsValid() {
		return workerclient.Dial(o.addr, tlsCfg)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: source.AsSlice()}}
	return workerclient.Dial(o.addr, tlsCfg, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", addr)
	}))
}

// sourceFor returns worker i's loopback source address: 127.1.0.1,
// 127.1.0.2, ... skipping .0 and .255 octets.
func sourceFor(i int64) netip.Addr {
	return netip.AddrFrom4([4]byte{127, byte(1 + i/(254*254)%254), byte(i/254%254 + 1), byte(i%254 + 1)})
}

// attempt is one request as a worker makes it; a response the worker
// could not use counts as DataLoss.
func attempt(ctx context.Context, o options, conn *grpc.ClientConn, token string, csr []byte) (*workerclient.Response, error) {
	actx, cancel := context.WithTimeout(ctx, o.reqTimeout)
	defer cancel()
	resp, err := workerclient.Request(actx, conn, token, csr)
	var bad *workerclient.ResponseError
	if errors.As(err, &bad) {
		return nil, status.Error(codes.DataLoss, bad.Error())
	}
	return resp, err
}

// newCSR is a worker's fresh key and CSR: a random host name as DNS SAN
// and CommonName, ip as IP SAN.
func newCSR(kt workerclient.KeyType, ip net.IP) (crypto.Signer, []byte, error) {
	host := "worker-" + strconv.FormatInt(randInt(1<<30), 36)
	return workerclient.NewCSR(rand.Reader, kt, &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: host},
		DNSNames:    []string{host},
		IPAddresses: []net.IP{ip},
	})
}

func printCert(w io.Writer, r *workerclient.Response) {
	c := r.Cert
	fmt.Fprintf(w, "issued: subject=%q dns=%v ips=%v eku=serverAuth not_after=%s serial=%x\n%s",
		c.Subject.String(), c.DNSNames, c.IPAddresses, c.NotAfter.Format(time.RFC3339), c.SerialNumber, r.CertPEM)
}

func randInt(n int64) int64 {
	if n <= 0 {
		return 0
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	v := int64(0)
	for _, x := range b {
		v = v<<8 | int64(x)
	}
	if v < 0 {
		v = -v
	}
	return v % n
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := int(float64(len(d)-1) * p)
	return d[i]
}

func (r *result) report(w io.Writer, o options) {
	sort.Slice(r.latencies, func(i, j int) bool { return r.latencies[i] < r.latencies[j] })
	sort.Slice(r.boots, func(i, j int) bool { return r.boots[i] < r.boots[j] })
	rate := float64(r.issued) / r.elapsed.Seconds()
	fmt.Fprintf(w, "certificates: %d/%d in %s (%.1f/s) workers=%d ramp=%s retry=%v key=%s reuse=%v light=%v\n",
		r.issued, o.requests, r.elapsed.Round(time.Millisecond), rate, o.workers, o.ramp, o.retry, o.keyType, o.reuse || o.light, o.light)
	if len(r.latencies) > 0 {
		fmt.Fprintf(w, "attempt latency: p50=%s p99=%s max=%s\n",
			percentile(r.latencies, 0.50).Round(time.Microsecond), percentile(r.latencies, 0.99).Round(time.Microsecond), r.latencies[len(r.latencies)-1].Round(time.Microsecond))
	}
	if o.retry && len(r.boots) > 0 {
		fmt.Fprintf(w, "time to certificate (arrival to issue): p50=%s p99=%s max=%s\n",
			percentile(r.boots, 0.50).Round(time.Millisecond), percentile(r.boots, 0.99).Round(time.Millisecond), r.boots[len(r.boots)-1].Round(time.Millisecond))
	}
	var keys []string
	for c, n := range r.codes {
		keys = append(keys, fmt.Sprintf("%s=%d", c, n))
	}
	sort.Strings(keys)
	if len(keys) == 0 {
		keys = []string{"none"}
	}
	fmt.Fprintf(w, "errors by code: %s\n", strings.Join(keys, " "))
	r.bootLog.report(w)
	if o.metrics != "" {
		reportDaemonCounters(w, o.metrics)
	}
	if r.serverCPU > 0 && r.issued > 0 {
		fmt.Fprintf(w, "server CPU per certificate: %.3f ms (%s over the run, pid %d)\n",
			float64(r.serverCPU.Microseconds())/1000/float64(r.issued), r.serverCPU, o.rssPID)
	}
	if o.rssPID > 0 {
		if hwm, err := peakRSS(o.rssPID); err == nil {
			fmt.Fprintf(w, "daemon peak RSS: %s\n", hwm)
		}
	}
}

func peakRSS(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			return strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:")), nil
		}
	}
	return "", errors.New("no VmHWM")
}
