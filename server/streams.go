package server

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// methodCertificate is the one RPC workers call.
const methodCertificate = "/securityapi.SecurityService/Certificate"

// errFirstMessage cancels a stream whose request message did not come in
// time.
var errFirstMessage = errors.New("no request message within the first-message timeout")

// streamGuard watches each stream from its headers to its end: it resets
// a stream whose message does not arrive within FirstMessageTimeout (gRPC
// reads the message before any handler or interceptor runs, so only the
// transport's tap and stats hooks see a client that never sends it),
// tells the connection listener which connections have finished their handshake,
// and accounts for requests gRPC refuses before the handler (oversized).
type streamGuard struct {
	lis     *connListener
	svc     *Service
	timeout time.Duration
	metrics *Metrics
	state   *stateLog
}

type streamKey struct{}

// streamState is one stream's progress.
type streamState struct {
	method  string
	peer    netip.AddrPort
	lis     *connListener
	conn    *trackedConn // nil for a server without the connection listener
	timer   *time.Timer
	phase   atomic.Int32 // streamWaiting, streamReceived, streamTimedOut
	handled atomic.Bool  // the handler ran
	authed  atomic.Bool  // the request counts its connection as authenticated
	once    sync.Once
}

const (
	streamWaiting int32 = iota
	streamReceived
	streamTimedOut
)

func streamFrom(ctx context.Context) *streamState {
	st, _ := ctx.Value(streamKey{}).(*streamState)
	return st
}

// tapHandle runs when a stream's headers arrive, on the connection's
// reader goroutine: it must stay cheap. The context it returns is the
// stream's own, which is what the transport's message read waits on.
func (g *streamGuard) tapHandle(ctx context.Context, info *tap.Info) (context.Context, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	st := &streamState{method: info.FullMethodName, peer: peerAddress(ctx), lis: g.lis}
	if p, ok := peer.FromContext(ctx); ok && g.lis != nil {
		st.conn = connOf(p.Addr)
	}
	if st.conn != nil {
		g.lis.streamStarted(st.conn)
	}
	st.timer = time.AfterFunc(g.timeout, func() {
		if !st.phase.CompareAndSwap(streamWaiting, streamTimedOut) {
			return
		}
		cancel(errFirstMessage)
		g.metrics.streamReset(closedFirstMessage)
		g.state.event(closedFirstMessage, "request streams without a request message are being reset (TRUSTD_FIRST_MESSAGE_TIMEOUT)", "peer", st.peer.String())
		// A worker sends its CSR at once; an unauthenticated connection
		// that stalls a stream is not one, and loses its slot.
		if st.conn != nil {
			g.lis.closeUnauthenticated(st.conn, closedFirstMessage)
		}
	})
	return context.WithValue(ctx, streamKey{}, st), nil
}

// received marks the request message as arrived.
func (st *streamState) received() {
	if st != nil && st.phase.CompareAndSwap(streamWaiting, streamReceived) {
		st.timer.Stop()
	}
}

// authenticated tells the listener that this stream carries a request
// that passed the token and the request checks: its connection counts as
// authenticated until the stream ends.
func (st *streamState) authenticated() {
	if st != nil && st.conn != nil && !st.authed.Load() && st.lis.requestStarted(st.conn) {
		st.authed.Store(true)
	}
}

func (st *streamState) markHandled() {
	if st != nil {
		st.handled.Store(true)
		st.received()
	}
}

// TagRPC implements stats.Handler.
func (g *streamGuard) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// HandleRPC implements stats.Handler.
func (g *streamGuard) HandleRPC(ctx context.Context, s stats.RPCStats) {
	st := streamFrom(ctx)
	switch s := s.(type) {
	case *stats.InPayload:
		st.received()
	case *stats.End:
		if st == nil {
			return
		}
		st.timer.Stop()
		if st.authed.CompareAndSwap(true, false) {
			st.lis.requestEnded(st.conn)
		}
		if !st.handled.Load() && st.method == methodCertificate && status.Code(s.Error) == codes.ResourceExhausted && g.svc != nil {
			st.once.Do(func() { g.svc.refusedOversized(ctx) })
		}
	}
}

// TagConn implements stats.Handler: it runs once the TLS and HTTP/2 set-up
// of a connection is complete.
func (g *streamGuard) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	if tc := connOf(info.RemoteAddr); tc != nil && g.lis != nil {
		g.lis.established(tc)
	}
	return ctx
}

// HandleConn implements stats.Handler.
func (g *streamGuard) HandleConn(context.Context, stats.ConnStats) {}
