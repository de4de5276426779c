package devtest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// LockedBuffer is a bytes.Buffer safe for a writer and readers at once
// (a process's output read while it runs).
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// FreePort returns a TCP port free on 127.0.0.1 right now.
func FreePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Daemon is a steward-trustd process started by StartDaemon.
type Daemon struct {
	// Addr is the loopback address it serves on.
	Addr string
	cmd  *exec.Cmd
	logs *LockedBuffer
	done chan error
}

// StartDaemon runs the steward-trustd binary bin on a free loopback port,
// with env added to a clean environment, and waits until it listens. It is
// stopped when the test ends.
func StartDaemon(tb testing.TB, bin string, env ...string) *Daemon {
	tb.Helper()
	port := FreePort(tb)
	cmd := exec.Command(bin)
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"TRUSTD_LISTEN_ADDRESS=127.0.0.1",
		fmt.Sprintf("TRUSTD_PORT=%d", port),
	}, env...)
	d := &Daemon{cmd: cmd, Addr: fmt.Sprintf("127.0.0.1:%d", port), logs: &LockedBuffer{}, done: make(chan error, 1)}
	pr, pw := io.Pipe()
	cmd.Stdout = d.logs
	cmd.Stderr = io.MultiWriter(d.logs, pw)
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		var once sync.Once
		for sc.Scan() {
			if strings.Contains(sc.Text(), "steward-trustd listening") {
				once.Do(func() { close(listening) })
			}
		}
	}()
	go func() { d.done <- cmd.Wait(); pw.Close() }()
	tb.Cleanup(func() { d.Stop(tb) })
	select {
	case <-listening:
	case err := <-d.done:
		d.done <- err
		tb.Fatalf("daemon exited before listening: %v\n%s", err, d.Logs())
	case <-time.After(60 * time.Second):
		tb.Fatalf("daemon did not listen within 60s\n%s", d.Logs())
	}
	return d
}

// PID is the daemon's process id (to read its memory use from /proc).
func (d *Daemon) PID() int { return d.cmd.Process.Pid }

// Logs returns everything the daemon printed so far.
func (d *Daemon) Logs() string { return d.logs.String() }

// Exited reports whether the process has ended.
func (d *Daemon) Exited() bool {
	select {
	case err := <-d.done:
		d.done <- err
		return true
	default:
		return false
	}
}

// Stop sends SIGINT and waits for a clean exit, failing tb if the daemon
// does not stop within 20 s or exits with an error.
func (d *Daemon) Stop(tb testing.TB) {
	select {
	case err := <-d.done:
		d.done <- err
		return
	default:
	}
	_ = d.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-d.done:
		d.done <- err
		if err != nil {
			tb.Errorf("daemon exit: %v\n%s", err, d.Logs())
		}
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		tb.Errorf("daemon did not stop within 20s of SIGINT\n%s", d.Logs())
	}
}
