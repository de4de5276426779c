// Command steward-trustd is a Talos-compatible trustd: it signs the apid
// serving certificates of Talos worker nodes with an OS CA key held in a
// TPM, a PKCS#11 token or a file.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run())
}

func run() int {
	cmd := &cobra.Command{
		Use:           "steward-trustd",
		Short:         "Talos-compatible trustd with the OS CA key in a TPM, an HSM or a file",
		Long:          "steward-trustd answers Talos workers' SecurityService/Certificate requests on port 50001.\nEvery flag can also be set with the environment variable shown in brackets; a flag wins over its variable.",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return &usageError{err: fmt.Errorf("unexpected argument %q: steward-trustd takes flags only", args[0])}
			}
			return nil
		},
	}
	registerFlags(cmd.Flags())
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err: err} })
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, err := loadConfig(resolve(cmd.Flags(), os.LookupEnv))
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
		defer stop()
		return serve(ctx, cfg, os.Stderr)
	}
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "steward-trustd:", err)
		var cfgErr *configError
		var useErr *usageError
		if errors.As(err, &cfgErr) || errors.As(err, &useErr) {
			return 2
		}
		return 1
	}
	return 0
}

// usageError is a bad command line: exit status 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }
