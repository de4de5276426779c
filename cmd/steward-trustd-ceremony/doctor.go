package main

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/internal/doctor"
)

func doctorCmd(stdout io.Writer) *cobra.Command {
	var mcPath, endpoint, caPath, output string
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "doctor --machineconfig worker.yaml [--endpoint host:port]",
		Short: "Connect to trustd exactly as a worker with this machine config would, and report each step",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := require(map[string]string{"machineconfig": mcPath}); err != nil {
				return err
			}
			if output != "text" && output != "json" {
				return usagef("--output must be text or json")
			}
			if timeout <= 0 {
				return usagef("--timeout must be positive")
			}
			data, err := os.ReadFile(mcPath)
			if err != nil {
				return err
			}
			wc, err := doctor.ParseWorkerConfig(data)
			if err != nil {
				return fmt.Errorf("%s: %w", mcPath, err)
			}
			o := doctor.Options{Config: wc, Endpoint: endpoint, Timeout: timeout, Rand: rand.Reader}
			if caPath != "" {
				if o.TalosctlCA, err = readCA(caPath); err != nil {
					return err
				}
			}
			rep := doctor.Run(cmd.Context(), o)
			if output == "json" {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				for _, s := range rep.Steps {
					mark := "ok  "
					if !s.OK {
						mark = "FAIL"
					}
					fmt.Fprintf(stdout, "%s %-16s %s", mark, s.Name, s.Target)
					if s.Detail != "" {
						fmt.Fprintf(stdout, ": %s", s.Detail)
					}
					fmt.Fprintln(stdout)
					if s.Hint != "" {
						fmt.Fprintf(stdout, "     hint: %s\n", s.Hint)
					}
				}
			}
			if !rep.OK() {
				return errors.New("doctor found problems (see above)")
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&mcPath, "machineconfig", "", "the worker's machine config (worker.yaml) or the ceremony's worker patch")
	f.StringVar(&endpoint, "endpoint", "", "host:port to dial instead of cluster.controlPlane.endpoint:50001")
	f.StringVar(&caPath, "talosctl-ca", "", "CA whose talosctl certificates must be accepted (default: machine.ca)")
	f.DurationVar(&timeout, "timeout", 10*time.Second, "timeout of each network step (a worker's attempt is 10s)")
	f.StringVarP(&output, "output", "o", "text", "text or json")
	return c
}
