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
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
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
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
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
	fs.IntVar(&o.rssPID, "daemon-pid", 0, "report this process's peak RSS (VmHWM) at the end")
	fs.DurationVar(&o.reqTimeout, "timeout", 10*time.Second, "per-attempt timeout (Talos uses 10s)")
	fs.BoolVar(&o.reuse, "reuse", false, "keep one connection per concurrent client (measures issuance, not TLS handshakes)")
	fs.BoolVar(&o.sources, "spread-sources", false, "give each simulated worker its own 127.x.y.z source address, as a fleet has (per-address rate limits apply per worker)")
	fs.StringVar(&o.backoff, "backoff", "fast", "with -retry, the wait between attempts: fast (250 ms doubling up to 4 s) or talos (Talos's RemoteGenerator: go-retry Exponential in 1 s units, 100 ms jitter: 0, 1, 3, 7, 15, 31 s)")
	fs.BoolVar(&o.anchor, "serve-anchor", false, "instead of loading, serve a bare Talos-style SecurityService (Talos trustd's per-request work with the file key in -certs: os-ca.key, server.crt/.key, token) on -addr until -duration or SIGINT, as the yardstick for the daemon's file path")
	fs.StringVar(&o.metrics, "metrics", "", "the daemon's metrics URL (http://127.0.0.1:PORT/metrics): report its issued, refused and late-signature counters at the end")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := o.validate(); err != nil {
		fmt.Fprintln(stderr, "load:", err)
		return 2
	}
	if o.anchor {
		return runAnchor(o, stderr)
	}
	res, err := runLoad(o, stdout)
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
	if o.keyType != "p256" && o.keyType != "ed25519" {
		return fmt.Errorf("-key %q: want p256 or ed25519", o.keyType)
	}
	if o.backoff != "" && o.backoff != "fast" && o.backoff != "talos" {
		return fmt.Errorf("-backoff %q: want fast or talos", o.backoff)
	}
	if o.metrics != "" {
		return checkMetricsURL(o.metrics)
	}
	return nil
}

type result struct {
	mu        sync.Mutex
	latencies []time.Duration // of successful attempts
	boots     []time.Duration // arrival to certificate, per worker
	codes     map[codes.Code]int
	issued    int
	elapsed   time.Duration
	bootLog   *bootLog
}

func (r *result) addErr(c codes.Code) {
	r.mu.Lock()
	r.codes[c]++
	r.mu.Unlock()
}

func runLoad(o options, stdout io.Writer) (*result, error) {
	token, err := os.ReadFile(filepath.Join(o.certs, "token"))
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	for _, f := range []string{"os-ca.crt", "accepted-cas.crt"} {
		b, err := os.ReadFile(filepath.Join(o.certs, f))
		if err != nil {
			if f == "accepted-cas.crt" && errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, err
		}
		if !roots.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("%s: no certificate", f)
		}
	}
	host, _, _ := net.SplitHostPort(o.addr)
	tlsCfg := &tls.Config{RootCAs: roots, ServerName: host, MinVersion: tls.VersionTLS12}
	ctx, cancel := context.WithTimeout(context.Background(), o.duration)
	defer cancel()

	start := time.Now()
	res := &result{codes: map[codes.Code]int{}, bootLog: newBootLog(o.requests, start)}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < o.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var kept *grpc.ClientConn // with -reuse: this client's connection
			defer func() {
				if kept != nil {
					kept.Close()
				}
			}()
			for {
				i := next.Add(1) - 1
				if i >= int64(o.requests) || ctx.Err() != nil {
					return
				}
				if o.ramp > 0 {
					arrival := start.Add(time.Duration(int64(o.ramp) * i / int64(o.requests)))
					select {
					case <-time.After(time.Until(arrival)):
					case <-ctx.Done():
						return
					}
				}
				var source netip.Addr
				if o.sources {
					source = sourceFor(i)
				}
				boot(ctx, o, tlsCfg, source, strings.TrimSpace(string(token)), res, stdout, &kept, i)
			}
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res, nil
}

// boot is one worker obtaining its certificate: a fresh key and CSR, and
// per attempt a fresh connection, retried with Talos-like backoff if asked.
func boot(ctx context.Context, o options, tlsCfg *tls.Config, source netip.Addr, token string, res *result, stdout io.Writer, kept **grpc.ClientConn, idx int64) {
	arrived := time.Now()
	ip := net.IPv4(127, 0, 0, 1)
	if source.IsValid() {
		ip = source.AsSlice()
	}
	_, csr, err := newCSR(o.keyType, ip)
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
		crt, err := attempt(ctx, o, conn, token, csr)
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
				printCert(stdout, crt)
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
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg.Clone()))}
	if source.IsValid() {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: source.AsSlice()}}
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}))
	}
	return grpc.NewClient(o.addr, opts...)
}

// sourceFor returns worker i's loopback source address: 127.1.0.1,
// 127.1.0.2, ... skipping .0 and .255 octets.
func sourceFor(i int64) netip.Addr {
	return netip.AddrFrom4([4]byte{127, byte(1 + i/(254*254)%254), byte(i/254%254 + 1), byte(i%254 + 1)})
}

func attempt(ctx context.Context, o options, conn *grpc.ClientConn, token string, csr []byte) ([]byte, error) {
	actx, cancel := context.WithTimeout(ctx, o.reqTimeout)
	defer cancel()
	actx = metadata.AppendToOutgoingContext(actx, "token", token)
	resp, err := securityapi.NewSecurityServiceClient(conn).Certificate(actx, &securityapi.CertificateRequest{Csr: csr})
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(resp.Ca) {
		return nil, status.Error(codes.DataLoss, "returned ca is not a PEM bundle")
	}
	block, _ := pem.Decode(resp.Crt)
	if block == nil {
		return nil, status.Error(codes.DataLoss, "returned crt is not PEM")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, status.Error(codes.DataLoss, "returned crt does not parse")
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return nil, status.Error(codes.DataLoss, "returned crt does not verify against ca")
	}
	return resp.Crt, nil
}

func newCSR(keyType string, ip net.IP) (crypto.Signer, []byte, error) {
	var key crypto.Signer
	var err error
	if keyType == "ed25519" {
		_, key, err = ed25519.GenerateKey(rand.Reader)
	} else {
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	}
	if err != nil {
		return nil, nil, err
	}
	host := "worker-" + strconv.FormatInt(randInt(1<<30), 36)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: host},
		DNSNames:    []string{host},
		IPAddresses: []net.IP{ip},
	}, key)
	if err != nil {
		return nil, nil, err
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

func printCert(w io.Writer, crtPEM []byte) {
	block, _ := pem.Decode(crtPEM)
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return
	}
	fmt.Fprintf(w, "issued: subject=%q dns=%v ips=%v eku=serverAuth not_after=%s serial=%x\n%s",
		c.Subject.String(), c.DNSNames, c.IPAddresses, c.NotAfter.Format(time.RFC3339), c.SerialNumber, crtPEM)
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
	fmt.Fprintf(w, "certificates: %d/%d in %s (%.1f/s) workers=%d ramp=%s retry=%v key=%s reuse=%v\n",
		r.issued, o.requests, r.elapsed.Round(time.Millisecond), rate, o.workers, o.ramp, o.retry, o.keyType, o.reuse)
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
