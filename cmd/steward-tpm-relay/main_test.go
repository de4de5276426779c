package main

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "x"}, "required"},
		{[]string{"--listen", "x", "--upstream", "y", "--latency", "Frob=1ms"}, "unknown TPM command"},
		{[]string{"--listen", "10.0.0.1:2321", "--upstream", "y"}, "only loopback"},
		{[]string{"--bogus"}, "unknown flag"},
		{[]string{"extra"}, "unknown command"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			var stderr bytes.Buffer
			if code := run(c.args, &stderr); code != 2 || !strings.Contains(stderr.String(), c.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, stderr.String(), c.want)
			}
		})
	}
}

// TestRelaysToSwtpm runs the command against a real swtpm's own socket and
// checks that a client gets answers and the latency applies.
func TestRelaysToSwtpm(t *testing.T) {
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	sock := filepath.Join(t.TempDir(), "r.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() {
		done <- serve(ctx, options{listen: sock, upstream: sw.RawSocket(), latency: []string{"GetRandom=30ms"}}, &logs)
	}()
	var conn net.Conn
	var err error
	for i := 0; i < 200; i++ {
		if conn, err = net.Dial("unix", sock); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	c := tpm.NewStreamTransport(conn)
	start := time.Now()
	if _, err := (tpm2.GetRandom{BytesRequested: 8}).Execute(c); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 30*time.Millisecond {
		t.Fatalf("GetRandom took %v with 30ms latency", took)
	}
	c.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
