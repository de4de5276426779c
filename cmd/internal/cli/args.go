package cli

import (
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// normalizeArgs rewrites long flags written with one dash (-cluster NAME,
// -force, -san=IP), as Go's flag package accepts them and the seed README
// documents, to the two-dash form cobra parses. A single-dash word is left
// alone when its first letter is a shorthand of the command (-o json,
// -ojson); the value of a flag that takes one is never rewritten, so
// "-output -odd-dir" keeps its directory. Everything after "--" is
// positional and kept as is, and so is a shell completion request.
func normalizeArgs(root *cobra.Command, args []string) []string {
	if len(args) > 0 && (args[0] == cobra.ShellCompRequestCmd || args[0] == cobra.ShellCompNoDescRequestCmd) {
		return args // the shell's word being completed must stay as typed
	}
	cmd := root
	if c, _, err := root.Find(args); err == nil {
		cmd = c
	}
	cmd.InitDefaultHelpFlag()
	root.InitDefaultVersionFlag()
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		a = longForm(cmd, a)
		out = append(out, a)
		if takesNextArg(cmd, a) && i+1 < len(args) {
			i++
			out = append(out, args[i])
		}
	}
	return out
}

// longForm is "--name..." for a single-dash word "-name..." that names a
// long flag, or that is no shorthand cluster of the command either (so
// that a typo reads "unknown flag: --nope").
func longForm(cmd *cobra.Command, a string) string {
	if len(a) < 3 || a[0] != '-' || a[1] == '-' {
		return a
	}
	name, _, _ := strings.Cut(a[1:], "=")
	if lookupFlag(cmd, name) == nil && lookupShorthand(cmd, a[1:2]) != nil {
		return a
	}
	return "-" + a
}

// takesNextArg says whether a is a flag whose value is the next word: a
// long flag without "=value" or a lone shorthand, neither boolean.
func takesNextArg(cmd *cobra.Command, a string) bool {
	var f *pflag.Flag
	switch {
	case strings.HasPrefix(a, "--"):
		name, _, hasValue := strings.Cut(a[2:], "=")
		if hasValue {
			return false
		}
		f = lookupFlag(cmd, name)
	case len(a) == 2 && a[0] == '-':
		f = lookupShorthand(cmd, a[1:])
	}
	return f != nil && f.NoOptDefVal == ""
}

// lookupFlag finds a flag of cmd or a persistent flag of its ancestors.
func lookupFlag(cmd *cobra.Command, name string) *pflag.Flag {
	return lookup(cmd, func(fs *pflag.FlagSet) *pflag.Flag { return fs.Lookup(name) })
}

// lookupShorthand finds a flag by its one-letter shorthand, like lookupFlag.
func lookupShorthand(cmd *cobra.Command, s string) *pflag.Flag {
	return lookup(cmd, func(fs *pflag.FlagSet) *pflag.Flag { return fs.ShorthandLookup(s) })
}

func lookup(cmd *cobra.Command, find func(*pflag.FlagSet) *pflag.Flag) *pflag.Flag {
	for c := cmd; c != nil; c = c.Parent() {
		if f := find(c.Flags()); f != nil {
			return f
		}
		if f := find(c.PersistentFlags()); f != nil {
			return f
		}
	}
	return nil
}
