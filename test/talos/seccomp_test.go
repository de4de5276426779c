package talos

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// This file turns a unit's RestrictAddressFamilies=, SystemCallFilter=
// and SystemCallArchitectures=native into the classic-BPF seccomp program
// systemd would install (seccomp(2), struct seccomp_data), for bwrap's
// --seccomp. Syscall sets come from `systemd-analyze syscall-filter`, so
// they are exactly the installed systemd's.

// seccomp_data offsets (linux/seccomp.h).
const (
	offNr   = 0
	offArch = 4
	offArg0 = 16 // low 32 bits of args[0], little-endian
	// x32 system calls have this bit set; "native" excludes them.
	x32SyscallBit = 0x40000000
)

// addressFamilies are the AF_ names a unit may list.
var addressFamilies = map[string]uint32{"AF_UNIX": unix.AF_UNIX, "AF_INET": unix.AF_INET, "AF_INET6": unix.AF_INET6, "AF_NETLINK": unix.AF_NETLINK, "AF_PACKET": unix.AF_PACKET}

// alwaysAllowed are allowed by systemd whatever the filter says
// (systemd.exec(5), SystemCallFilter=).
var alwaysAllowed = []string{"execve", "exit", "exit_group", "getrlimit", "rt_sigreturn", "sigreturn"}

// seccompFilter is the program: wrong architecture → kill; socket() with a
// family outside families → EAFNOSUPPORT (RestrictAddressFamilies); a
// syscall outside allowed → kill (SystemCallFilter's default action).
func seccompFilter(t *testing.T, families []string, allowed map[uint32]bool, socketNr uint32) []byte {
	t.Helper()
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: nativeAuditArch(t), SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_PROCESS},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpBitsNotSet, Val: x32SyscallBit, SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_PROCESS},
	}
	if allowed[socketNr] {
		prog = append(prog, socketFamilies(t, families, socketNr)...)
	}
	for nr := range allowed {
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: nr, SkipTrue: 1}, bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW})
	}
	prog = append(prog, bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_PROCESS})
	raw, err := bpf.Assemble(prog)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for _, ins := range raw { // struct sock_filter
		_ = binary.Write(&buf, binary.LittleEndian, struct {
			Op     uint16
			Jt, Jf uint8
			K      uint32
		}{ins.Op, ins.Jt, ins.Jf, ins.K})
	}
	return buf.Bytes()
}

// socketFamilies: for socket(), allow the listed families, refuse others
// with EAFNOSUPPORT as systemd does; other syscalls skip the block.
func socketFamilies(t *testing.T, families []string, socketNr uint32) []bpf.Instruction {
	t.Helper()
	block := []bpf.Instruction{bpf.LoadAbsolute{Off: offArg0, Size: 4}}
	for _, f := range families {
		af, ok := addressFamilies[f]
		if !ok {
			t.Fatalf("RestrictAddressFamilies: unknown family %q", f)
		}
		block = append(block, bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: af, SkipTrue: 1}, bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW})
	}
	block = append(block, bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.EAFNOSUPPORT)})
	return append([]bpf.Instruction{bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: socketNr, SkipTrue: uint8(len(block))}}, block...)
}

func nativeAuditArch(t *testing.T) uint32 {
	t.Helper()
	switch runtime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64
	}
	t.Fatalf("no seccomp architecture for %s", runtime.GOARCH)
	return 0
}

// syscallFilter evaluates SystemCallFilter= lines as systemd does: the
// first line decides allow-list (no ~) or deny-list (~) mode, later lines
// add (no ~) or remove (~) names; @sets expand. It returns the allowed
// syscall numbers of this architecture.
func syscallFilter(t *testing.T, lines []string) map[uint32]bool {
	t.Helper()
	sets := syscallSets(t)
	numbers := syscallNumbers(t)
	names := map[string]bool{}
	if len(lines) == 0 || strings.HasPrefix(lines[0], "~") {
		for n := range numbers {
			names[n] = true // deny-list mode starts from everything
		}
	}
	for _, l := range lines {
		deny := strings.HasPrefix(l, "~")
		for _, w := range strings.Fields(strings.TrimPrefix(l, "~")) {
			for n := range expandSet(t, sets, w) {
				names[n] = !deny
			}
		}
	}
	for _, n := range alwaysAllowed {
		names[n] = true
	}
	allowed := map[uint32]bool{}
	for n, ok := range names {
		if nr, known := numbers[n]; ok && known {
			allowed[nr] = true
		}
	}
	return allowed
}

func expandSet(t *testing.T, sets map[string][]string, w string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	if !strings.HasPrefix(w, "@") {
		out[w] = true
		return out
	}
	members, ok := sets[w]
	if !ok {
		t.Fatalf("systemd-analyze knows no syscall set %s", w)
	}
	for _, m := range members {
		for n := range expandSet(t, sets, m) {
			out[n] = true
		}
	}
	return out
}

// syscallSets parses `systemd-analyze syscall-filter`: "@set" headers,
// indented members (names or nested @sets), "#" comments.
func syscallSets(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command("systemd-analyze", "syscall-filter").Output()
	if err != nil {
		t.Fatalf("systemd-analyze syscall-filter: %v", err)
	}
	sets := map[string][]string{}
	var cur string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		w := strings.TrimSpace(line)
		switch {
		case w == "" || strings.HasPrefix(w, "#"):
		case !strings.HasPrefix(line, " ") && strings.HasPrefix(w, "@"):
			cur = w
		case cur != "" && strings.HasPrefix(line, " "):
			sets[cur] = append(sets[cur], w)
		}
	}
	if len(sets["@system-service"]) == 0 {
		t.Fatalf("systemd-analyze syscall-filter printed no @system-service set:\n%s", out)
	}
	return sets
}

var nrDefine = regexp.MustCompile(`^#define __NR_(\w+)\s+(\d+)$`)

// syscallNumbers maps syscall names to numbers from the kernel headers
// (linux-libc-dev), amd64 only: the test machines are amd64.
func syscallNumbers(t *testing.T) map[string]uint32 {
	t.Helper()
	if runtime.GOARCH != "amd64" {
		t.Fatalf("syscall numbers are read for amd64 only, not %s", runtime.GOARCH)
	}
	const header = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"
	b, err := os.ReadFile(header)
	if err != nil {
		t.Fatalf("%v (linux-libc-dev)", err)
	}
	nums := map[string]uint32{}
	for _, l := range strings.Split(string(b), "\n") {
		if m := nrDefine.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			n, _ := strconv.ParseUint(m[2], 10, 32)
			nums[m[1]] = uint32(n)
		}
	}
	if nums["socket"] != unix.SYS_SOCKET {
		t.Fatalf("%s: socket is %d, want %d", header, nums["socket"], unix.SYS_SOCKET)
	}
	return nums
}
