package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/steward-trustd/steward-trustd/internal/authz"
	"github.com/steward-trustd/steward-trustd/internal/inventory"
)

func TestMachineEntry(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
		"metadata": map[string]any{"name": "md-0-abc", "namespace": "prod"},
		"spec":     map[string]any{"providerID": "metal://r1/7"},
		"status": map[string]any{
			"nodeRef":   map[string]any{"name": "worker-7"},
			"addresses": []any{map[string]any{"type": "InternalIP", "address": "10.0.0.7"}, map[string]any{"type": "Hostname", "address": "worker-7.lan"}, map[string]any{"type": "InternalIP", "address": "nonsense"}, "garbage"},
		},
	}}
	e := machineEntry(u)
	if e.Key != "worker-7" || e.Machine.Name != "md-0-abc" || e.Machine.UUID != "metal://r1/7" || len(e.Machine.Addresses) != 1 || e.Machine.Hostnames[0] != "worker-7.lan" {
		t.Fatalf("%+v", e)
	}
}

// TestServeFileOverUnixSocket: the command serves the file inventory on
// its socket, a client speaking the protocol gets decisions from it, and
// the pins are in the state file afterwards.
func TestServeFileOverUnixSocket(t *testing.T) {
	dir := t.TempDir()
	inv := filepath.Join(dir, "inventory.json")
	body := `{"apiVersion":"` + inventory.FileVersion + `","machines":[{"name":"w1","addresses":["10.0.0.1"]}]}`
	if err := os.WriteFile(inv, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	sock, state := filepath.Join(dir, "a.sock"), filepath.Join(dir, "state.json")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	var stderr bytes.Buffer
	go func() {
		done <- run(ctx, []string{"serve", "--listen", "unix://" + sock, "--source", "file:" + inv, "--state", state}, &bytes.Buffer{}, &stderr)
	}()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	decide := func(peer, name string) (*authz.Response, error) {
		req, _ := json.Marshal(&authz.Request{APIVersion: authz.APIVersion, Peer: peer, DNSNames: []string{name}, IPAddresses: []string{peer}})
		resp, err := client.Post("http://authorizer"+authz.DecidePath, "application/json", bytes.NewReader(req))
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		return authz.DecodeResponse(resp.Body)
	}
	waitFor(t, func() bool { _, err := decide("10.0.0.1", "w1"); return err == nil })
	for _, c := range []struct{ peer, name, outcome string }{
		{"10.0.0.1", "w1", authz.OutcomeAllowed},
		{"10.0.0.2", "w1", authz.OutcomeUnknownMachine},
	} {
		r, err := decide(c.peer, c.name)
		if err != nil || r.Outcome != c.outcome {
			t.Fatalf("%s %s: %+v %v", c.peer, c.name, r, err)
		}
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode: %v %v", fi.Mode(), err)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("serve exited %d: %s", code, stderr.String())
	}
	var out bytes.Buffer
	if code := run(context.Background(), []string{"pins", "--state", state}, &out, &bytes.Buffer{}); code != 0 || !strings.HasPrefix(out.String(), "10.0.0.1\tw1\t") {
		t.Fatalf("pins: %d %q", code, out.String())
	}
	if code := run(context.Background(), []string{"unpin", "--state", state, "10.0.0.1"}, &out, &bytes.Buffer{}); code != 0 {
		t.Fatalf("unpin: %d", code)
	}
	if code := run(context.Background(), []string{"unpin", "--state", state, "10.0.0.1"}, &out, &bytes.Buffer{}); code != 1 {
		t.Fatalf("second unpin: %d, want 1", code)
	}
}

func TestServeUsage(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--source", "nodes", "--state", "/x"},
		{"serve", "--listen", "unix:///x.sock", "--state", "/x"},
		{"serve", "--listen", "unix:///x.sock", "--source", "nodes"},
		{"serve", "--listen", "unix:///x.sock", "--source", "pods", "--state", "/x"},
		{"serve", "--listen", "127.0.0.1:0", "--source", "nodes", "--state", "/x"},
		{"serve", "--listen", "unix:///x.sock", "--source", "nodes", "--state", "/x", "--socket-mode", "0666"},
		{"serve", "--listen", "unix:///x.sock", "--source", "nodes", "--state", "/x", "--extra-cidrs", "0.0.0.0/0"},
		{"unpin", "--state", "/x", "not-an-ip"},
	} {
		if code := run(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{}); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
