package attack

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
)

// attacker holds connections against the daemon until stopped. Each slot
// keeps one connection (or client) busy and opens a new one when the
// daemon closes it, so the pressure lasts the whole attack: the limits
// are tested against a client that comes back, not one that gives up.
type attacker struct {
	addr   string
	srcs   []string // loopback source addresses, used in turn
	slots  int
	action func(ctx context.Context, a *attacker, src string) error

	opened  atomic.Int64 // connections the attacker got open
	streams atomic.Int64 // request streams it started
	held    atomic.Int64 // connections open right now
	peak    atomic.Int64
}

// run drives the slots until ctx ends and returns when they have all
// stopped.
func (a *attacker) run(ctx context.Context) {
	var wg sync.WaitGroup
	for i := range a.slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := a.srcs[i%len(a.srcs)]
			for ctx.Err() == nil {
				if err := a.action(ctx, a, src); err != nil {
					sleepCtx(ctx, 20*time.Millisecond) // refused: come back soon
				}
			}
		}()
	}
	wg.Wait()
}

// hold counts conn as held until it is closed by the daemon or ctx ends.
func (a *attacker) hold(ctx context.Context, conn net.Conn) {
	a.opened.Add(1)
	n := a.held.Add(1)
	for p := a.peak.Load(); n > p && !a.peak.CompareAndSwap(p, n); p = a.peak.Load() {
	}
	defer a.held.Add(-1)
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	_, _ = io.Copy(io.Discard, conn) // until the daemon closes it
	conn.Close()
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func dialFrom(ctx context.Context, src, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
	return d.DialContext(ctx, "tcp", addr)
}

// silentSocket opens a TCP connection and sends nothing.
func silentSocket(ctx context.Context, a *attacker, src string) error {
	c, err := dialFrom(ctx, src, a.addr)
	if err != nil {
		return err
	}
	a.hold(ctx, c)
	return nil
}

// h2Conn sets up TLS and HTTP/2 (preface and SETTINGS) the way any client
// can, without a token and without gRPC's client-side checks.
func h2Conn(ctx context.Context, src, addr string) (*tls.Conn, *http2.Framer, error) {
	raw, err := dialFrom(ctx, src, addr)
	if err != nil {
		return nil, nil, err
	}
	c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) //nolint:gosec // an attacker checks nothing
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.HandshakeContext(hctx); err != nil {
		raw.Close()
		return nil, nil, err
	}
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		c.Close()
		return nil, nil, err
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, fr, nil
}

// idleConnection sets up TLS and HTTP/2 and then does nothing.
func idleConnection(ctx context.Context, a *attacker, src string) error {
	c, _, err := h2Conn(ctx, src, a.addr)
	if err != nil {
		return err
	}
	a.hold(ctx, c)
	return nil
}

// hangingStream opens one Certificate stream (HEADERS with a token) and
// never sends the request message.
func hangingStream(ctx context.Context, a *attacker, src string) error {
	c, fr, err := h2Conn(ctx, src, a.addr)
	if err != nil {
		return err
	}
	a.streams.Add(1)
	if err := writeHeaders(fr, 1, requestHeaders("not-the-token", 0), true); err != nil {
		c.Close()
		return err
	}
	a.hold(ctx, c)
	return nil
}

// headerFlood opens streams whose header list is padBytes of metadata
// each, in one HEADERS frame and CONTINUATION frames, ignoring the
// daemon's advertised limit; the stream then hangs.
func headerFlood(streams, padBytes int) func(context.Context, *attacker, string) error {
	block := requestHeaders("not-the-token", padBytes)
	return func(ctx context.Context, a *attacker, src string) error {
		c, fr, err := h2Conn(ctx, src, a.addr)
		if err != nil {
			return err
		}
		go func() {
			for i := range streams {
				if ctx.Err() != nil {
					return
				}
				a.streams.Add(1)
				if writeHeaders(fr, uint32(2*i+1), block, true) != nil {
					return
				}
			}
		}()
		a.hold(ctx, c)
		return nil
	}
}

// requestHeaders is the HPACK block of a Certificate request with pad
// bytes of extra metadata in 4 KiB values (each under any string limit,
// so the daemon must bound the list, not one value).
func requestHeaders(token string, pad int) []byte {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	fields := []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "https"},
		{Name: ":path", Value: "/securityapi.SecurityService/Certificate"}, {Name: ":authority", Value: "127.0.0.1"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		{Name: "token", Value: token},
	}
	value := strings.Repeat("p", 4<<10)
	for sent := 0; sent < pad; sent += len(value) {
		fields = append(fields, hpack.HeaderField{Name: "x-pad", Value: value, Sensitive: true})
	}
	for _, f := range fields {
		_ = enc.WriteField(f)
	}
	return buf.Bytes()
}

// writeHeaders sends block as HEADERS plus CONTINUATION frames of 16 KiB.
func writeHeaders(fr *http2.Framer, stream uint32, block []byte, hang bool) error {
	const frame = 16 << 10
	first := block[:min(frame, len(block))]
	rest := block[len(first):]
	err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: first, EndHeaders: len(rest) == 0, EndStream: !hang})
	for err == nil && len(rest) > 0 {
		n := min(frame, len(rest))
		err = fr.WriteContinuation(stream, n == len(rest), rest[:n])
		rest = rest[n:]
	}
	return err
}

// wrongTokenClient sends requests with a wrong token, back to back, from
// src: the misconfigured neighbour behind the worker's NAT.
func wrongTokenClient(caPool *tlsRoots) func(context.Context, *attacker, string) error {
	return func(ctx context.Context, a *attacker, src string) error {
		dialer := func(ctx context.Context, addr string) (net.Conn, error) { return dialFrom(ctx, src, addr) }
		conn, err := grpc.NewClient(a.addr, grpc.WithContextDialer(dialer),
			grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: caPool.pool, ServerName: "127.0.0.1"})))
		if err != nil {
			return err
		}
		defer conn.Close()
		a.opened.Add(1)
		client := securityapi.NewSecurityServiceClient(conn)
		rctx := metadata.AppendToOutgoingContext(ctx, "token", "stale.token0000000")
		for ctx.Err() == nil {
			a.streams.Add(1)
			_, _ = client.Certificate(rctx, &securityapi.CertificateRequest{Csr: []byte("x")})
		}
		return nil
	}
}
