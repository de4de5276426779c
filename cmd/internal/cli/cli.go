// Package cli is the command-line idiom shared by steward-trustd,
// steward-trustd-ceremony, steward-trustd-gencreds and steward-tpm-relay:
// one usage error type and its exit status, --version and a shell
// `completion` command on every binary, long flags written with one dash
// or two, and flag types that refuse bad values at parse time (lists,
// bounded durations, PCR selections).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"

	"github.com/spf13/cobra"
)

// Exit statuses of every steward-trustd binary.
const (
	// ExitOK is success.
	ExitOK = 0
	// ExitFailed means the operation was attempted and failed.
	ExitFailed = 1
	// ExitUsage means the command line was wrong; nothing was attempted.
	ExitUsage = 2
)

// UsageError marks an error in the command line: exit status [ExitUsage].
type UsageError struct{ Err error }

// Error returns the message of the wrapped error.
func (e *UsageError) Error() string { return e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef returns a [UsageError] with a formatted message.
func Usagef(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

// Usage marks err as a usage error; nil stays nil.
func Usage(err error) error {
	if err == nil {
		return nil
	}
	return &UsageError{Err: err}
}

// ExitCode is the exit status for the error a command returned.
func ExitCode(err error) int {
	var ue *UsageError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ue):
		return ExitUsage
	default:
		return ExitFailed
	}
}

// Setup applies the shared idiom to a root command whose subcommands are
// already added: --version (the binary's build version and Go version),
// errors and usage printed once by [Run], flag errors as usage errors, a
// root without its own action that asks for a command, and the shell
// `completion` command.
func Setup(root *cobra.Command, version string) {
	root.Version = version
	root.SetVersionTemplate("{{.Name}} version {{.Version}} (" + runtime.Version() + ")\n")
	root.SilenceUsage, root.SilenceErrors = true, true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return Usage(err) })
	root.CompletionOptions.DisableDefaultCmd = false
	if !root.Runnable() && root.HasSubCommands() {
		root.Args = cobra.ArbitraryArgs
		root.RunE = commandRequired
	}
	noArgsByDefault(root)
}

// noArgsByDefault makes the commands that declare no positional arguments
// refuse them: cobra's legacy rule would silently ignore them on
// subcommands.
func noArgsByDefault(c *cobra.Command) {
	c.SilenceUsage, c.SilenceErrors = true, true
	if c.Args == nil {
		c.Args = noArgs
	}
	for _, sub := range c.Commands() {
		noArgsByDefault(sub)
	}
}

// commandRequired is the action of a root that only dispatches.
func commandRequired(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return Usagef("unknown command %q", args[0])
	}
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() && c.Name() != "completion" {
			names = append(names, c.Name())
		}
	}
	return Usagef("a command is required (%s)", strings.Join(names, ", "))
}

// Run executes root with args and returns the exit status. Errors are
// printed once to stderr as "<command>: <error>"; usage errors add where
// to find the usage.
func Run(ctx context.Context, root *cobra.Command, args []string, stdout, stderr io.Writer) int {
	// Output first: the completion command binds it when it is made.
	root.SetOut(stdout)
	root.SetErr(stderr)
	args = normalizeArgs(root, args)
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd(args...)
	strictArgs(root)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	fmt.Fprintf(stderr, "%s: %v\n", root.Name(), err)
	code := ExitCode(err)
	if code == ExitUsage {
		fmt.Fprintf(stderr, "run '%s --help' for usage\n", cmd.CommandPath())
	}
	return code
}

// strictArgs makes every positional-argument error a usage error,
// including those of cobra's own help and completion commands.
func strictArgs(c *cobra.Command) {
	if validate := c.Args; validate != nil {
		c.Args = func(cmd *cobra.Command, args []string) error { return Usage(validate(cmd, args)) }
	}
	for _, sub := range c.Commands() {
		strictArgs(sub)
	}
}

func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected argument %q", args[0])
	}
	return nil
}
