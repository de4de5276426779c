package attack

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	talosx509 "github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/grpc/middleware/auth/basic"
	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc"

	"github.com/steward-trustd/steward-trustd/internal/workerclient"
)

// fleet is workers each on its own loopback address, a WAN away: every
// write of theirs is delayed (a stand-in for the round trip), and each
// attempt is what machined's RemoteGenerator makes — a fresh key, CSR and
// connection, the token as Talos's per-RPC credentials, 10 s.
type fleet struct {
	addr, token string
	caPEM       []byte
	tlsCfg      *tls.Config
	delay       time.Duration
	next        atomic.Int64 // source addresses handed out
}

// workerAddr is the n-th worker's address, in 127.100.0.0/16, away from
// every attacker's.
func workerAddr(n int) string {
	return "127.100." + strconv.Itoa(n/250%250) + "." + strconv.Itoa(n%250+1)
}

// attemptFrom makes one worker attempt from src.
func (f *fleet) attemptFrom(ctx context.Context, src string) error {
	accepted := []*talosx509.PEMEncodedCertificate{{Crt: f.caPEM}}
	ca, err := accepted[0].GetCert()
	if err != nil {
		return err
	}
	csr, _, err := talosx509.NewCSRAndIdentityFromCA(ca,
		talosx509.IPAddresses([]net.IP{net.ParseIP(src)}), talosx509.DNSNames([]string{"worker"}), talosx509.CommonName("worker"))
	if err != nil {
		return err
	}
	dialer := func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := dialFrom(ctx, src, addr)
		if err != nil {
			return nil, err
		}
		return &slowConn{Conn: c, delay: f.delay}, nil
	}
	cc, err := workerclient.Dial(f.addr, f.tlsCfg, grpc.WithContextDialer(dialer), grpc.WithPerRPCCredentials(basic.NewTokenCredentials(f.token)))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := securityapi.NewSecurityServiceClient(cc).Certificate(ctx, &securityapi.CertificateRequest{Csr: csr.X509CertificateRequestPEM})
	if err == nil && len(resp.GetCrt()) == 0 {
		err = fmt.Errorf("empty certificate")
	}
	return err
}

// run makes attempts, c at a time, each from a new worker address, until
// d has passed and at least n attempts were made.
func (f *fleet) run(n, c int, d time.Duration) result {
	res := result{errs: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	var started atomic.Int64
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for started.Add(1) <= int64(n) || time.Now().Before(end) {
				src := workerAddr(int(f.next.Add(1)))
				t0 := time.Now()
				err := f.attemptFrom(context.Background(), src)
				mu.Lock()
				res.record(err, time.Since(t0))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return res
}

func (r *result) record(err error, took time.Duration) {
	r.total++
	if err != nil {
		r.errs[shortErr(err)]++
		return
	}
	r.ok++
	r.latencies = append(r.latencies, took)
}

// slowConn delays every write: a client a round trip away.
type slowConn struct {
	net.Conn
	delay time.Duration
}

func (c *slowConn) Write(b []byte) (int, error) {
	time.Sleep(c.delay)
	return c.Conn.Write(b)
}

// gaugeWatch samples series of the daemon's /metrics until stopped and
// keeps their maxima.
type gaugeWatch struct {
	url    string
	series []string
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	max    map[string]float64
}

func watchGauges(url string, series ...string) *gaugeWatch {
	w := &gaugeWatch{url: url, series: series, stop: make(chan struct{}), done: make(chan struct{}), max: map[string]float64{}}
	go func() {
		defer close(w.done)
		for {
			m, _ := scrapeErr(url) // a failed scrape is a gap in the samples
			w.mu.Lock()
			for _, s := range series {
				w.max[s] = max(w.max[s], m[s])
			}
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return w
}

// maxima stops the watch and returns the maxima seen.
func (w *gaugeWatch) maxima() map[string]float64 {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.max
}
