// Command steward-trustd-ceremony is the OS CA key ceremony of
// steward-trustd: it creates or imports the CA key on a TPM, a PKCS#11
// HSM or (explicitly) a file, and issues everything that used to need the
// key file: talosctl client certificates and talosconfigs, trustd's
// serving certificate, CA rotations. See keystore/README.md.
//
// Exit codes: 0 success, 1 the operation failed, 2 usage error.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, nil)
	stop()
	os.Exit(code)
}

// run executes one command; env overrides the process environment in
// tests (nil means the real one).
func run(ctx context.Context, args []string, stdout, stderr io.Writer, env *environment) int {
	if env == nil {
		env = defaultEnvironment()
	}
	root := newRoot(env, stdout, stderr)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "steward-trustd-ceremony: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintln(stderr, "run 'steward-trustd-ceremony --help' for usage")
		return exitUsage
	}
	return exitFail
}

// usageError marks errors in the command line (exit code 2).
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}
