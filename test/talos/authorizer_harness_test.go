package talos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	talosx509 "github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/grpc/gen"

	"github.com/steward-trustd/steward-trustd/internal/authz"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/internal/inventory"
)

// sourceProxy forwards connections it accepts on 127.0.0.1 to target from
// the source address src, so that Talos's worker code (which cannot bind
// a source address) reaches the daemon from a machine's own 127.0.0.x
// address, as each real worker has its own. It returns its address.
func sourceProxy(t testing.TB, src, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { forward(in, dialer, target) })
		}
	})
	return ln.Addr().String()
}

// forward copies between in and a new connection to target until either
// side closes.
func forward(in net.Conn, dialer *net.Dialer, target string) {
	defer in.Close()
	out, err := dialer.Dial("tcp", target)
	if err != nil {
		return
	}
	defer out.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) { _, _ = io.Copy(dst, src); _ = dst.Close(); done <- struct{}{} }
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
}

// machine is one inventory entry as the test's worker presents it.
type inventoryMachine struct {
	name    string
	addr    string // its source address and IP SAN
	created string // RFC 3339, "" for none
}

// writeInventory atomically replaces the inventory file at path (a
// rename, as a config management tool or an operator's editor does).
func writeInventory(t testing.TB, path, joinWindow string, machines ...inventoryMachine) {
	t.Helper()
	type entry struct {
		Name      string   `json:"name"`
		Addresses []string `json:"addresses"`
		Created   string   `json:"created,omitempty"`
	}
	doc := struct {
		APIVersion string            `json:"apiVersion"`
		Rules      map[string]string `json:"rules"`
		Machines   []entry           `json:"machines"`
	}{APIVersion: inventory.FileVersion, Rules: map[string]string{"joinWindow": joinWindow}, Machines: []entry{}}
	for _, m := range machines {
		doc.Machines = append(doc.Machines, entry{Name: m.name, Addresses: []string{m.addr}, Created: m.created})
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".new", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// authorizerProc is a running steward-trustd-authorizer serve.
type authorizerProc struct {
	cmd  *exec.Cmd
	logs *devtest.LockedBuffer
	done chan error
}

// authorizerFiles are the paths one authorizer (and its restarts) uses.
type authorizerFiles struct {
	bin, sock, inventory, state string
}

// start runs `serve` on f's socket, inventory and state and waits until
// it answers decisions. It is killed when the test ends.
func (f authorizerFiles) start(t testing.TB) *authorizerProc {
	t.Helper()
	cmd := exec.Command(f.bin, "serve", "--listen", "unix://"+f.sock, "--source", "file:"+f.inventory,
		"--state", f.state, "--reload-interval", "100ms")
	p := &authorizerProc{cmd: cmd, logs: &devtest.LockedBuffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(p.kill)
	eventually(t, 60*time.Second, "authorizer answering on its socket", func() bool {
		_, err := f.decide("192.0.2.1", "probe")
		return err == nil
	})
	return p
}

// kill ends the process with SIGKILL (no clean shutdown, the socket file
// stays behind) and waits for it.
func (p *authorizerProc) kill() {
	select {
	case err := <-p.done:
		p.done <- err
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	p.done <- <-p.done
}

// decide asks the authorizer directly (not through the daemon) whether
// peer may have a certificate for its own address and name.
func (f authorizerFiles) decide(peer, name string) (string, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", f.sock)
	}}}
	defer client.CloseIdleConnections()
	body, err := json.Marshal(&authz.Request{APIVersion: authz.APIVersion, Peer: peer, DNSNames: []string{name}, IPAddresses: []string{peer}, TokenIndex: -1})
	if err != nil {
		return "", err
	}
	resp, err := client.Post("http://authorizer"+authz.DecidePath, "application/json", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("authorizer answered %s", resp.Status)
	}
	r, err := authz.DecodeResponse(resp.Body)
	if err != nil {
		return "", err
	}
	return r.Outcome, nil
}

// machineRequest runs Talos's own worker code (a v1.10+ CSR with the
// machine's SANs, sent through RemoteGenerator) against the daemon at
// addr. RemoteGenerator retries every error until its context ends, so a
// refusal returns after timeout with the last error.
func machineRequest(t *testing.T, addr, token string, caPEM []byte, ip, name string, timeout time.Duration) ([]byte, []byte, *talosx509.PEMEncodedCertificateAndKey, error) {
	t.Helper()
	accepted := []*talosx509.PEMEncodedCertificate{{Crt: caPEM}}
	caCert, err := accepted[0].GetCert()
	if err != nil {
		t.Fatal(err)
	}
	csr, identity, err := talosx509.NewCSRAndIdentityFromCA(caCert,
		talosx509.IPAddresses([]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(ip)}),
		talosx509.DNSNames([]string{name}), talosx509.CommonName(name))
	if err != nil {
		t.Fatal(err)
	}
	remote, err := gen.NewRemoteGenerator(token, []string{addr}, accepted)
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	ca, crt, err := remote.IdentityContext(ctxTimeout(t, timeout), csr)
	if err == nil && (len(crt) == 0 || len(ca) == 0) {
		err = errors.New("empty certificate in a successful answer")
	}
	return ca, crt, identity, err
}
