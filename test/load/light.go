package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	securityapi "github.com/siderolabs/talos/pkg/machinery/api/security"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/workerclient"
)

// maxLightRequests bounds the CSRs a -light run makes before it starts
// (about 0.5 KiB each).
const maxLightRequests = 200_000

// lightRun is a -light run: CSRs made and connections set up (TCP, TLS,
// HTTP/2) before the clock starts, so that the measured window holds
// nothing but requests and the server's cost per certificate dominates.
type lightRun struct {
	o     options
	ctx   context.Context // carries the token
	csrs  [][]byte
	conns []*grpc.ClientConn
	res   *result
	next  atomic.Int64
}

// runLight measures o.requests certificates over o.workers kept-alive
// connections with pre-made CSRs.
func runLight(o options) (*result, error) {
	token, tlsCfg, err := workerCredentials(o)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.duration)
	defer cancel()
	csrs, err := premadeCSRs(workerclient.KeyType(o.keyType), o.requests)
	if err != nil {
		return nil, err
	}
	conns, err := connectAll(ctx, o, tlsCfg)
	defer closeAll(conns)
	if err != nil {
		return nil, err
	}
	l := &lightRun{o: o, ctx: metadata.AppendToOutgoingContext(ctx, workerclient.TokenMetadata, token), csrs: csrs, conns: conns,
		res: &result{codes: map[codes.Code]int{}, bootLog: newBootLog(o.requests, time.Now())}}
	l.res.latencies = make([]time.Duration, 0, o.requests)
	cpu0, cpuErr := serverCPU(o)
	start := time.Now()
	var wg sync.WaitGroup
	for _, cc := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.client(cc)
		}()
	}
	wg.Wait()
	l.res.elapsed = time.Since(start)
	if cpu1, err := serverCPU(o); err == nil && cpuErr == nil {
		l.res.serverCPU = cpu1 - cpu0
	}
	return l.res, nil
}

// serverCPU is -daemon-pid's CPU time so far; an error without one.
func serverCPU(o options) (time.Duration, error) {
	if o.rssPID <= 0 {
		return 0, errors.New("no -daemon-pid")
	}
	return processCPU(o.rssPID)
}

// workerCredentials reads the token and the worker's trust anchors from
// o.certs, as a worker has them from its machine config.
func workerCredentials(o options) (string, *tls.Config, error) {
	dir := certdir.OSDir(o.certs)
	token, err := dir.ReadFile(certdir.FileToken)
	if err != nil {
		return "", nil, fmt.Errorf("worker token: %w", err)
	}
	_, bundle, err := certdir.ReadBundle(dir)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", o.certs, err)
	}
	host, _, _ := net.SplitHostPort(o.addr)
	return strings.TrimSpace(string(token)), workerclient.TLSConfig(workerclient.Roots(bundle...), host), nil
}

// premadeCSRs makes n CSRs, each with its own key and host name.
func premadeCSRs(kt workerclient.KeyType, n int) ([][]byte, error) {
	csrs := make([][]byte, n)
	for i := range csrs {
		_, csr, err := newCSR(kt, net.IPv4(127, 0, 0, 1))
		if err != nil {
			return nil, err
		}
		csrs[i] = csr
	}
	return csrs, nil
}

// connectAll opens o.workers connections and waits until each is ready
// (TLS and HTTP/2 set up), so no handshake falls in the measured window.
func connectAll(ctx context.Context, o options, tlsCfg *tls.Config) ([]*grpc.ClientConn, error) {
	conns := make([]*grpc.ClientConn, 0, o.workers)
	for range o.workers {
		cc, err := workerclient.Dial(o.addr, tlsCfg)
		if err != nil {
			return conns, err
		}
		conns = append(conns, cc)
		cc.Connect()
	}
	for _, cc := range conns {
		if err := waitReady(ctx, cc); err != nil {
			return conns, fmt.Errorf("connect to %s: %w", o.addr, err)
		}
	}
	return conns, nil
}

func waitReady(ctx context.Context, cc *grpc.ClientConn) error {
	for {
		s := cc.GetState()
		switch s {
		case connectivity.Ready:
			return nil
		case connectivity.Idle:
			cc.Connect()
		case connectivity.TransientFailure, connectivity.Shutdown:
			return fmt.Errorf("connection %s", s)
		}
		if !cc.WaitForStateChange(ctx, s) {
			return fmt.Errorf("connection still %s: %w", s, ctx.Err())
		}
	}
}

func closeAll(conns []*grpc.ClientConn) {
	for _, cc := range conns {
		cc.Close()
	}
}

// client sends requests on cc one after another until all are taken. Its
// first response is checked as a worker checks it (parsed, chained to the
// bundle for ServerAuth); later ones only for a non-empty crt and ca, so
// that the client's own parsing does not eat the cores it shares with the
// server.
func (l *lightRun) client(cc *grpc.ClientConn) {
	api := securityapi.NewSecurityServiceClient(cc)
	checked := false
	for {
		i := l.next.Add(1) - 1
		if i >= int64(len(l.csrs)) || l.ctx.Err() != nil {
			return
		}
		t0 := time.Now()
		err := l.request(api, l.csrs[i], !checked)
		if err != nil {
			l.res.addErr(status.Code(err))
			continue
		}
		checked = true
		l.res.mu.Lock()
		l.res.issued++
		l.res.latencies = append(l.res.latencies, time.Since(t0))
		l.res.mu.Unlock()
	}
}

// errEmptyResponse is a response without crt or ca.
var errEmptyResponse = errors.New("empty crt or ca")

func (l *lightRun) request(api securityapi.SecurityServiceClient, csr []byte, check bool) error {
	ctx, cancel := context.WithTimeout(l.ctx, l.o.reqTimeout)
	defer cancel()
	resp, err := api.Certificate(ctx, &securityapi.CertificateRequest{Csr: csr})
	switch {
	case err != nil:
		return err
	case len(resp.GetCrt()) == 0 || len(resp.GetCa()) == 0:
		return status.Error(codes.DataLoss, errEmptyResponse.Error())
	case check:
		if _, err := workerclient.Check(resp.GetCrt(), resp.GetCa()); err != nil {
			return status.Error(codes.DataLoss, err.Error())
		}
	}
	return nil
}
