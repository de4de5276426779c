package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "x"}, "required"},
		{[]string{"--listen", "x", "--upstream", "y", "--latency", "Frob=1ms"}, "unknown TPM command"},
		{[]string{"--listen", "10.0.0.1:2321", "--upstream", "y"}, "only loopback"},
		{[]string{"--bogus"}, "unknown flag"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			t.Parallel()
			var stderr bytes.Buffer
			if code := run(context.Background(), c.args, io.Discard, &stderr); code != cli.ExitUsage || !strings.Contains(stderr.String(), c.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, stderr.String(), c.want)
			}
		})
	}
}

// TestCommandLineIdiom: the relay shares the other binaries' command-line
// idiom (cmd/internal/cli): --version, one-dash long flags, completion.
func TestCommandLineIdiom(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"--version"}, cli.ExitOK, "steward-tpm-relay version dev (go", ""},
		{[]string{"--help"}, cli.ExitOK, "--latency", ""},
		{[]string{"completion", "bash"}, cli.ExitOK, "__start_steward-tpm-relay", ""},
		{[]string{"-listen", "x"}, cli.ExitUsage, "", "run 'steward-tpm-relay --help' for usage"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), c.args, &stdout, &stderr); code != c.code || !strings.Contains(stdout.String(), c.stdout) || !strings.Contains(stderr.String(), c.stderr) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d, %q, %q", c.args, code, stdout.String(), stderr.String(), c.code, c.stdout, c.stderr)
		}
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

// TestTPM2ToolsThroughRelay: with --tcti-listen, Debian's tpm2-tools
// (tpm2-tss's swtpm TCTI: control channel on PORT+1) extend and read PCR 7
// through the relay while another client (standing in for the daemon)
// holds a loaded key, and tpm2_flushcontext --transient-object does not
// take that key away.
func TestTPM2ToolsThroughRelay(t *testing.T) {
	extend, read, flush := tpmsim.RequireTool(t, "tpm2_pcrextend"), tpmsim.RequireTool(t, "tpm2_pcrread"), tpmsim.RequireTool(t, "tpm2_flushcontext")
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	sock := filepath.Join(t.TempDir(), "r.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	logs := &devtest.LockedBuffer{}
	go func() {
		done <- serve(ctx, options{listen: sock, tctiListen: "127.0.0.1:0", upstream: sw.RawSocket()}, logs)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	tcti := waitTCTI(t, logs)
	daemon := tpm.NewStreamTransport(dialUnix(t, sock))
	defer daemon.Close()
	key, err := tpm2.CreatePrimary{PrimaryHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)}, InPublic: tpm2.New2B(tpm2.ECCSRKTemplate)}.Execute(daemon)
	if err != nil {
		t.Fatal(err)
	}
	before := pcr7(t, daemon)
	event := sha256.Sum256([]byte("firmware 1.2.3"))
	env := append(os.Environ(), "TPM2TOOLS_TCTI="+tcti)
	for _, args := range [][]string{{extend, fmt.Sprintf("7:sha256=%x", event)}, {flush, "--transient-object"}} {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s\nrelay:\n%s", args, err, out, logs)
		}
	}
	cmd := exec.Command(read, "sha256:7")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	want := sha256.Sum256(append(before, event[:]...))
	if err != nil || !strings.Contains(strings.ToLower(string(out)), fmt.Sprintf("%x", want)) {
		t.Fatalf("tpm2_pcrread: %v\n%s\nwant PCR 7 = %x", err, out, want)
	}
	if got := pcr7(t, daemon); !bytes.Equal(got, want[:]) {
		t.Fatalf("PCR 7 seen by the daemon %x, want %x", got, want)
	}
	if _, err := (tpm2.ReadPublic{ObjectHandle: key.ObjectHandle}).Execute(daemon); err != nil {
		t.Fatalf("the daemon's key is gone after tpm2-tools ran: %v", err)
	}
	if _, err := (tpm2.FlushContext{FlushHandle: key.ObjectHandle}).Execute(daemon); err != nil {
		t.Fatal(err)
	}
}

// waitTCTI returns the TCTI string the relay logs once it serves tpm2-tools.
func waitTCTI(t *testing.T, logs *devtest.LockedBuffer) string {
	t.Helper()
	re := regexp.MustCompile(`tcti="?(swtpm:host=127\.0\.0\.1,port=\d+)`)
	for range 500 {
		if m := re.FindStringSubmatch(logs.String()); m != nil {
			return m[1]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the relay never served tpm2-tools:\n%s", logs)
	return ""
}

func dialUnix(t *testing.T, sock string) net.Conn {
	t.Helper()
	var err error
	for range 200 {
		var c net.Conn
		if c, err = net.Dial("unix", sock); err == nil {
			return c
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal(err)
	return nil
}

func pcr7(t *testing.T, c transport.TPM) []byte {
	t.Helper()
	rsp, err := tpm2.PCRRead{PCRSelectionIn: tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{{Hash: tpm2.TPMAlgSHA256, PCRSelect: []byte{0x80, 0, 0}}}}}.Execute(c)
	if err != nil || len(rsp.PCRValues.Digests) != 1 {
		t.Fatalf("read PCR 7: %v", err)
	}
	return rsp.PCRValues.Digests[0].Buffer
}
