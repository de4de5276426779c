// Command steward-trustd is a Talos-compatible trustd: it signs the apid
// serving certificates of Talos worker nodes with an OS CA key held in a
// TPM, a PKCS#11 token or a file.
//
// Exit codes: 0 clean shutdown, 1 failed, 2 bad command line or
// configuration.
package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/harden"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// Before anything reads a token, a PIN or a key.
	harden.AtStart(os.Stderr, "steward-trustd")
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv))
}

// run is main without the process: getenv is the environment.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) (string, bool)) int {
	cmd := &cobra.Command{
		Use:   "steward-trustd",
		Short: "Talos-compatible trustd with the OS CA key in a TPM, an HSM or a file",
		Long: "steward-trustd answers Talos workers' SecurityService/Certificate requests on port 50001.\n" +
			"Every flag can also be set with the environment variable shown in brackets; a flag wins over its variable.\n" +
			"Flags take one dash or two. Exit codes: 0 clean shutdown, 1 failed, 2 bad command line or configuration.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(resolve(cmd.Flags(), getenv))
			if err != nil {
				return asUsage(err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			return asUsage(serve(ctx, cfg, stderr))
		},
	}
	registerFlags(cmd.Flags())
	cli.Setup(cmd, version)
	return cli.Run(ctx, cmd, args, stdout, stderr)
}

// asUsage makes a configuration error a usage error (exit 2): the fix is
// in the command line or the environment.
func asUsage(err error) error {
	var cfgErr *configError
	if errors.As(err, &cfgErr) {
		return cli.Usage(err)
	}
	return err
}
