package main

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/doctor"
)

// doctorFlags are the flags of doctor.
type doctorFlags struct {
	machineConfig, endpoint, talosctlCA, output string
	timeout                                     time.Duration
}

// options reads the machine config and the talosctl CA.
func (f doctorFlags) options() (doctor.Options, error) {
	data, err := os.ReadFile(f.machineConfig)
	if err != nil {
		return doctor.Options{}, err
	}
	wc, err := doctor.ParseWorkerConfig(data)
	if err != nil {
		return doctor.Options{}, fmt.Errorf("%s: %w", f.machineConfig, err)
	}
	o := doctor.Options{Config: wc, Endpoint: f.endpoint, Timeout: f.timeout, Rand: rand.Reader}
	if f.talosctlCA != "" {
		if o.TalosctlCA, err = readCA(f.talosctlCA); err != nil {
			return doctor.Options{}, err
		}
	}
	return o, nil
}

func doctorCmd(stdout io.Writer) *cobra.Command {
	var f doctorFlags
	c := &cobra.Command{
		Use:   "doctor --machineconfig worker.yaml [--endpoint host:port]",
		Short: "Connect to trustd exactly as a worker with this machine config would, and report each step",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Required(map[string]string{"machineconfig": f.machineConfig}); err != nil {
				return err
			}
			if err := checkOutput(f.output); err != nil {
				return err
			}
			o, err := f.options()
			if err != nil {
				return err
			}
			return reportDoctor(stdout, f.output, doctor.Run(cmd.Context(), o))
		},
	}
	fs := c.Flags()
	fs.StringVar(&f.machineConfig, "machineconfig", "", "the worker's machine config (worker.yaml) or the ceremony's worker patch")
	fs.StringVar(&f.endpoint, "endpoint", "", "host:port to dial instead of the machine config's cluster endpoint host:50001")
	fs.StringVar(&f.talosctlCA, "talosctl-ca", "", "CA whose talosctl certificates must be accepted (default: machine.ca)")
	cli.DurationVar(fs, &f.timeout, "timeout", 10*time.Second, 100*time.Millisecond, 5*time.Minute, "timeout of each network step (a worker's attempt is 10s)")
	fs.StringVarP(&f.output, "output", "o", "text", "text or json")
	return c
}

// reportDoctor prints the report; any failed step fails the command.
func reportDoctor(w io.Writer, output string, rep *doctor.Report) error {
	if output == "json" {
		if err := writeJSON(w, rep); err != nil {
			return err
		}
	} else {
		printDoctor(w, rep)
	}
	if !rep.OK() {
		return errors.New("doctor found problems (see above)")
	}
	return nil
}

func printDoctor(w io.Writer, rep *doctor.Report) {
	for _, s := range rep.Steps {
		mark := "ok  "
		if !s.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "%s %-16s %s", mark, s.Name, s.Target)
		if s.Detail != "" {
			fmt.Fprintf(w, ": %s", s.Detail)
		}
		fmt.Fprintln(w)
		if s.Hint != "" {
			fmt.Fprintf(w, "     hint: %s\n", s.Hint)
		}
	}
}
