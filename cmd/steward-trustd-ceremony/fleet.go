package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/fleet"
)

// fleetOptions are the flags of `fleet check`.
type fleetOptions struct {
	nodes, ca                   string
	port, concurrency, maxNodes int
	timeout                     time.Duration
}

func fleetCmd(stdout io.Writer) *cobra.Command {
	c := &cobra.Command{
		Use:   "fleet check --nodes FILE|CIDR --ca os-ca.crt",
		Short: "Check, from outside, which client CAs the workers' apid accepts",
	}
	c.AddCommand(fleetCheckCmd(stdout))
	return c
}

func fleetCheckCmd(stdout io.Writer) *cobra.Command {
	var o fleetOptions
	c := &cobra.Command{
		Use:   "check --nodes FILE|CIDR --ca os-ca.crt [--port 50000] [--timeout 5s] [--concurrency 16] [--max-nodes 1024]",
		Short: "Flag every worker whose apid accepts a client CA the root did not vouch for",
		Long: `fleet check connects to each node's apid (TLS, port 50000) without credentials and reads the
client-CA names its CertificateRequest lists: the worker's apid client-CA pool, which it took from
its trustd's ca bundle. A node is FLAGGED when a name is not matched by the root or a CA the root
vouches for (os-ca.crt and the accepted-cas.crt entries named in accepted-cas.statement.json next
to --ca), when it asks for no client certificate, or when its serving certificate does not chain
to the root; UNREACHABLE when no handshake got that far. Names, not keys, are listed: a CA copying
a vouched CA's name is seen as an extra entry, but one replacing it under the same name is not.
It connects only to the nodes given: --nodes is a CIDR (at most --max-nodes addresses) or a file,
one host, IP or host:port per line. One line per node; exit 1 when any node is flagged or
unreachable, 0 when all are OK.`,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd, stdout) },
	}
	f := c.Flags()
	f.StringVar(&o.nodes, "nodes", "", "a CIDR (every address in it) or a file of hosts, one per line; required")
	f.StringVar(&o.ca, "ca", "", "the root, os-ca.crt of the ceremony directory (its accepted-cas.crt and statement are read too); required")
	f.IntVar(&o.port, "port", fleet.DefaultPort, "apid port where a node gives none")
	f.DurationVar(&o.timeout, "timeout", 5*time.Second, "bound on each node's connection and handshake (up to 1m)")
	f.IntVar(&o.concurrency, "concurrency", 16, "nodes checked at once (1-256)")
	f.IntVar(&o.maxNodes, "max-nodes", 1024, "refuse a CIDR or file with more nodes than this (1-65536)")
	return c
}

// check validates the flags; every error is a usage error.
func (o *fleetOptions) check() error {
	if err := cli.Required(map[string]string{"nodes": o.nodes, "ca": o.ca}); err != nil {
		return err
	}
	switch {
	case o.port < 1 || o.port > 65535:
		return cli.Usagef("--port %d: want 1-65535", o.port)
	case o.timeout <= 0 || o.timeout > time.Minute:
		return cli.Usagef("--timeout %v: want more than 0 and at most 1m", o.timeout)
	case o.concurrency < 1 || o.concurrency > 256:
		return cli.Usagef("--concurrency %d: want 1-256", o.concurrency)
	case o.maxNodes < 1 || o.maxNodes > 65536:
		return cli.Usagef("--max-nodes %d: want 1-65536", o.maxNodes)
	}
	return nil
}

func (o *fleetOptions) run(cmd *cobra.Command, stdout io.Writer) error {
	if err := o.check(); err != nil {
		return err
	}
	nodes, err := o.readNodes()
	if err != nil {
		return err
	}
	checker, err := o.checker()
	if err != nil {
		return err
	}
	results := checker.CheckAll(cmd.Context(), nodes)
	for _, r := range results {
		fmt.Fprintln(stdout, r.Line())
	}
	return fleet.Summarize(results)
}

// readNodes parses --nodes: a CIDR, else the file it names.
func (o *fleetOptions) readNodes() ([]string, error) {
	data, err := os.ReadFile(o.nodes)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("--nodes: %w", err)
	}
	nodes, err := fleet.ParseNodes(o.nodes, data, o.port, o.maxNodes)
	if err != nil {
		return nil, cli.Usage(err)
	}
	return nodes, nil
}

// checker reads the vouched set from the directory of --ca.
func (o *fleetOptions) checker() (*fleet.Checker, error) {
	root, err := readCA(o.ca)
	if err != nil {
		return nil, err
	}
	ca, vouched, err := certdir.ReadBundle(certdir.OSDir(filepath.Dir(o.ca)))
	if err != nil {
		return nil, fmt.Errorf("read the vouched CAs beside --ca: %w", err)
	}
	if !ca.Equal(root) {
		return nil, fmt.Errorf("--ca %s is not the %s of its directory", o.ca, certdir.FileCACert)
	}
	return &fleet.Checker{Root: root, Vouched: vouched, Timeout: o.timeout, Concurrency: o.concurrency}, nil
}
