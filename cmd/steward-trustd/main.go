// Command steward-trustd is a Talos-compatible trustd: it signs the apid
// serving certificates of Talos worker nodes with an OS CA key held in a
// TPM, a PKCS#11 token or a file.
package main

import (
	"context"
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
		Args:          cobra.NoArgs,
	}
	registerFlags(cmd.Flags())
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
		return 1
	}
	return 0
}
