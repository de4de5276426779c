package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// testRoot is a dispatching root with one subcommand, as the ceremony is.
func testRoot(got *[]string, force *bool, hours *time.Duration) *cobra.Command {
	root := &cobra.Command{Use: "tool"}
	sub := &cobra.Command{
		Use: "issue",
		RunE: func(_ *cobra.Command, _ []string) error {
			if len(*got) > 0 && (*got)[0] == "fail" {
				return errors.New("device on fire")
			}
			return nil
		},
	}
	ListVar(sub.Flags(), got, "san", nil, "names")
	sub.Flags().BoolVar(force, "force", false, "replace")
	HoursVar(sub.Flags(), hours, "hours", 24, MaxLeafHours, "validity")
	sub.Flags().StringP("output", "o", "text", "format")
	root.AddCommand(sub)
	Setup(root, "1.2.3")
	return root
}

func TestRunExitCodes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr []string
		stdout string
	}{
		{"ok", []string{"issue", "--san", "a"}, ExitOK, nil, ""},
		{"failure", []string{"issue", "--san", "fail"}, ExitFailed, []string{"tool: device on fire"}, ""},
		{"no command", nil, ExitUsage, []string{"a command is required (issue)", "run 'tool --help' for usage"}, ""},
		{"unknown command", []string{"nope"}, ExitUsage, []string{`unknown command "nope"`}, ""},
		{"unknown flag", []string{"issue", "--nope"}, ExitUsage, []string{"unknown flag: --nope", "run 'tool issue --help'"}, ""},
		{"unknown single-dash flag", []string{"issue", "-nope"}, ExitUsage, []string{"unknown flag: --nope"}, ""},
		{"positional", []string{"issue", "extra"}, ExitUsage, []string{`unexpected argument "extra"`}, ""},
		{"hours zero", []string{"issue", "--hours", "0"}, ExitUsage, []string{`"--hours"`, "must be 1 to 87600 hours (10 years)"}, ""},
		{"hours overflow", []string{"issue", "--hours", "2562048"}, ExitUsage, []string{`"--hours"`, "must be 1 to 87600"}, ""},
		{"hours not a number", []string{"issue", "--hours", "1y"}, ExitUsage, []string{`"1y" is not a whole number of hours`}, ""},
		{"version", []string{"--version"}, ExitOK, nil, "tool version 1.2.3 (go"},
		{"version single dash", []string{"-version"}, ExitOK, nil, "tool version 1.2.3"},
		{"help", []string{"issue", "--help"}, ExitOK, nil, "--hours hours"},
		{"completion", []string{"completion", "bash"}, ExitOK, nil, "bash completion"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var sans []string
			var force bool
			var hours time.Duration
			var out, errb bytes.Buffer
			code := Run(context.Background(), testRoot(&sans, &force, &hours), tt.args, &out, &errb)
			if code != tt.code {
				t.Fatalf("exit %d, want %d; stderr %s", code, tt.code, errb.String())
			}
			for _, s := range tt.stderr {
				if !strings.Contains(errb.String(), s) {
					t.Errorf("stderr %q does not mention %q", errb.String(), s)
				}
			}
			if !strings.Contains(out.String(), tt.stdout) {
				t.Errorf("stdout %q does not contain %q", out.String(), tt.stdout)
			}
		})
	}
}

func TestSingleDashLongFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args  []string
		sans  []string
		force bool
		hours time.Duration
	}{
		{[]string{"issue", "-san", "a", "-force", "-hours", "2"}, []string{"a"}, true, 2 * time.Hour},
		{[]string{"issue", "-san=a,b", "-force=false", "-hours=3"}, []string{"a", "b"}, false, 3 * time.Hour},
		{[]string{"issue", "--san", "a", "--san", " b ,", "--force"}, []string{"a", "b"}, true, 24 * time.Hour},
		// A value is never rewritten, even when it looks like a flag.
		{[]string{"issue", "-san", "-force"}, []string{"-force"}, false, 24 * time.Hour},
		// Shorthand clusters stay shorthands.
		{[]string{"issue", "-ojson", "-o", "-force"}, nil, false, 24 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			var sans []string
			var force bool
			var hours time.Duration
			var out, errb bytes.Buffer
			if code := Run(context.Background(), testRoot(&sans, &force, &hours), tt.args, &out, &errb); code != ExitOK {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			if fmt.Sprint(sans) != fmt.Sprint(tt.sans) || force != tt.force || hours != tt.hours {
				t.Errorf("san %q force %t hours %v, want %q %t %v", sans, force, hours, tt.sans, tt.force, tt.hours)
			}
		})
	}
}

func TestRootWithAction(t *testing.T) {
	t.Parallel()
	ran := false
	root := &cobra.Command{Use: "daemon", RunE: func(*cobra.Command, []string) error { ran = true; return nil }}
	root.Flags().String("port", "", "port")
	Setup(root, "v")
	var out, errb bytes.Buffer
	if code := Run(context.Background(), root, []string{"-port", "-1"}, &out, &errb); code != ExitOK || !ran {
		t.Fatalf("exit %d ran %t: %s", code, ran, errb.String())
	}
	if v := root.Flags().Lookup("port").Value.String(); v != "-1" {
		t.Errorf("port %q", v)
	}
	root = &cobra.Command{Use: "daemon", RunE: func(*cobra.Command, []string) error { return nil }}
	Setup(root, "v")
	if code := Run(context.Background(), root, []string{"extra"}, &out, &errb); code != ExitUsage {
		t.Errorf("positional on a root with an action: exit %d", code)
	}
	root = &cobra.Command{Use: "daemon", RunE: func(*cobra.Command, []string) error { return nil }}
	Setup(root, "v")
	out.Reset()
	if code := Run(context.Background(), root, []string{"completion", "zsh"}, &out, &errb); code != ExitOK || !strings.Contains(out.String(), "#compdef daemon") {
		t.Errorf("completion zsh on a root without subcommands: exit %d %q", code, out.String())
	}
}

func TestExitCode(t *testing.T) {
	t.Parallel()
	wrapped := fmt.Errorf("context: %w", Usagef("bad %s", "flag"))
	for _, tt := range []struct {
		err  error
		want int
	}{
		{nil, ExitOK},
		{errors.New("x"), ExitFailed},
		{wrapped, ExitUsage},
		{Usage(errors.New("y")), ExitUsage},
	} {
		if got := ExitCode(tt.err); got != tt.want {
			t.Errorf("ExitCode(%v) = %d, want %d", tt.err, got, tt.want)
		}
	}
	if Usage(nil) != nil {
		t.Error("Usage(nil) is not nil")
	}
}

func TestHelpAndCompletionRequests(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"help", "issue"}, "--hours hours"},
		{[]string{"help"}, "Available Commands"},
		{[]string{cobra.ShellCompRequestCmd, "issue", "--ho"}, "--hours"},
		{[]string{cobra.ShellCompRequestCmd, ""}, "issue"},
	} {
		var sans []string
		var force bool
		var hours time.Duration
		var out, errb bytes.Buffer
		if code := Run(context.Background(), testRoot(&sans, &force, &hours), tt.args, &out, &errb); code != ExitOK || !strings.Contains(out.String(), tt.want) {
			t.Errorf("%q: exit %d, stdout %q does not contain %q; stderr %s", tt.args, code, out.String(), tt.want, errb.String())
		}
	}
}
