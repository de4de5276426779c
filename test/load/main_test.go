package main

import (
	"io"
	"net/netip"
	"os"
	"testing"
	"time"
)

func TestValidateLoopbackOnly(t *testing.T) {
	base := options{workers: 1, requests: 1, duration: time.Minute, keyType: "p256"}
	cases := []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:50001", true},
		{"127.9.8.7:1", true},
		{"[::1]:50001", true},
		{"10.0.0.1:50001", false},
		{"192.168.1.1:50001", false},
		{"8.8.8.8:50001", false},
		{"localhost:50001", false}, // names are not resolved: no guessing where traffic goes
		{"127.0.0.1", false},
	}
	for _, c := range cases {
		o := base
		o.addr = c.addr
		if err := o.validate(); (err == nil) != c.ok {
			t.Errorf("validate(%s) = %v, want ok=%v", c.addr, err, c.ok)
		}
	}
	for _, bad := range []options{
		{addr: "127.0.0.1:1", workers: 0, requests: 1, duration: time.Minute, keyType: "p256"},
		{addr: "127.0.0.1:1", workers: 1, requests: 1, duration: 2 * time.Hour, keyType: "p256"},
		{addr: "127.0.0.1:1", workers: 1, requests: 1, duration: time.Minute, keyType: "rsa"},
		{addr: "127.0.0.1:1", workers: 1, requests: 1, duration: time.Minute, keyType: "p256", light: true, retry: true},
		{addr: "127.0.0.1:1", workers: 1, requests: 1, duration: time.Minute, keyType: "p256", light: true, ramp: time.Second},
		{addr: "127.0.0.1:1", workers: 1, requests: maxLightRequests + 1, duration: time.Minute, keyType: "p256", light: true},
		{addr: "127.0.0.1:1", workers: 1, requests: maxLightRequests + 1, duration: time.Minute, keyType: "p256", cpuBound: true},
	} {
		if err := bad.validate(); err == nil {
			t.Errorf("validate(%+v) accepted", bad)
		}
	}
}

func TestSourceForStaysOnLoopback(t *testing.T) {
	seen := map[netip.Addr]bool{}
	for i := int64(0); i < 200000; i += 7 {
		a := sourceFor(i)
		if !a.IsLoopback() {
			t.Fatalf("source %s for worker %d is not loopback", a, i)
		}
		b := a.As4()
		if b[3] == 0 || b[3] == 255 || b[2] == 0 || b[2] == 255 {
			t.Fatalf("source %s uses a .0 or .255 octet", a)
		}
		if seen[a] {
			t.Fatalf("source %s repeats", a)
		}
		seen[a] = true
	}
}

func TestLightDefaultsTo32Connections(t *testing.T) {
	// -light's default is 32 kept-alive connections; an explicit -workers
	// is kept, and the heavy client's default is unchanged.
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"-light"}, lightWorkers},
		{[]string{"-light", "-workers", "3"}, 3},
		{nil, 8},
	} {
		o, err := parseOptions(c.args, io.Discard)
		if err != nil || o.workers != c.want {
			t.Errorf("%v: workers %d, want %d (%v)", c.args, o.workers, c.want, err)
		}
	}
}

func TestRunRefusesBadArguments(t *testing.T) {
	if code := run([]string{"-addr", "10.1.2.3:50001"}, io.Discard, io.Discard); code != 2 {
		t.Fatalf("non-loopback target: exit %d, want 2", code)
	}
	if code := run([]string{"-nope"}, io.Discard, io.Discard); code != 2 {
		t.Fatalf("unknown flag: exit %d, want 2", code)
	}
}

func TestProcessCPU(t *testing.T) {
	before, err := processCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
		// spin: the CPU time must grow
	}
	after, err := processCPU(os.Getpid())
	if err != nil || after <= before {
		t.Errorf("CPU time %s then %s (%v): want it to grow while the test spins", before, after, err)
	}
	if _, err := processCPU(-1); err == nil {
		t.Error("a process that does not exist has a CPU time")
	}
}
