// Command steward-trustd-authorizer decides, for steward-trustd, whether
// a worker may get an apid serving certificate: the machine must be in
// the inventory (a JSON file, Kubernetes Nodes, Cluster API Machines),
// own the address it calls from and every SAN it asks for. It serves the
// decision protocol (docs/authorizer-protocol.md) on a unix socket or on
// TCP with mutual TLS, and keeps its pins in a state file.
//
//	steward-trustd-authorizer serve --listen unix:///run/steward-trustd/authorizer.sock --source nodes --source machines --state /var/lib/steward-trustd-authorizer/state.json
//	steward-trustd-authorizer pins --state FILE
//	steward-trustd-authorizer unpin --state FILE ADDRESS
//
// It is its own Go module so that client-go's dependency graph stays out
// of the daemon's and the ceremony's module. Exit codes: 0 success,
// 1 failure, 2 usage error.
package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/authz"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := &cobra.Command{
		Use:   "steward-trustd-authorizer",
		Short: "Decide which machine may get a certificate from steward-trustd",
		Long: `steward-trustd-authorizer answers steward-trustd's decision requests against an
inventory of machines (a JSON file, Kubernetes Nodes, Cluster API Machines): the
caller's address must belong to exactly one machine and every SAN must be that
machine's. The first accepted address of a machine is pinned in the state file.
Exit codes: 0 success, 1 failure, 2 usage error.`,
	}
	root.AddCommand(serveCommand(stderr), pinsCommand(stdout), unpinCommand(stdout))
	cli.Setup(root, version)
	return cli.Run(ctx, root, args, stdout, stderr)
}

func pinsCommand(stdout io.Writer) *cobra.Command {
	var state string
	c := &cobra.Command{
		Use:   "pins --state FILE",
		Short: "List the pinned addresses and their machines",
		RunE: func(*cobra.Command, []string) error {
			st, err := openExistingState(state)
			if err != nil {
				return err
			}
			pins := st.Pins()
			addrs := make([]netip.Addr, 0, len(pins))
			for a := range pins {
				addrs = append(addrs, a)
			}
			sort.Slice(addrs, func(i, j int) bool { return addrs[i].Less(addrs[j]) })
			for _, a := range addrs {
				fmt.Fprintf(stdout, "%s\t%s\t%s\n", a, pins[a].Machine, pins[a].Since.Format("2006-01-02T15:04:05Z"))
			}
			return nil
		},
	}
	c.Flags().StringVar(&state, "state", "", "the authorizer's state file")
	return c
}

func unpinCommand(stdout io.Writer) *cobra.Command {
	var state string
	c := &cobra.Command{
		Use:   "unpin --state FILE ADDRESS",
		Short: "Remove an address's pin (it was given to another machine on purpose); stop the authorizer first",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			a, err := netip.ParseAddr(args[0])
			if err != nil {
				return cli.Usagef("%q is not an IP address", args[0])
			}
			st, err := openExistingState(state)
			if err != nil {
				return err
			}
			ok, err := st.Unpin(a)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%s has no pin (list them with: steward-trustd-authorizer pins --state %s)", a, state)
			}
			fmt.Fprintf(stdout, "unpinned %s\n", a)
			return nil
		},
	}
	c.Flags().StringVar(&state, "state", "", "the authorizer's state file")
	return c
}

func openExistingState(path string) (*authz.State, error) {
	if path == "" {
		return nil, cli.Usagef("--state is required")
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("state file: %w", err)
	}
	return authz.OpenState(path)
}
