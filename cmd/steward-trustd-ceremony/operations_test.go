package main

import (
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/keystore"
)

// commandOperations is the receipt operations each command can write,
// spelt as they are on disk: an earlier run's receipts are found by
// these names, so renaming one breaks resuming a directory written by an
// older version. A command that writes no receipt says why.
var commandOperations = map[string][]string{
	"init":                    {"init", "init.key", "policy.approve"},
	"import":                  {"import", "policy.approve"},
	"rotate":                  {"rotate", "rotate.key", "rotate.finish", "intermediate.key", "intermediate.request", "intermediate.rotate.finish", "policy.approve"},
	"trust add":               {"trust.add"},
	"trust remove":            {"trust.remove"},
	"sign-csr":                {"sign-csr"},
	"talosconfig":             {"talosconfig"},
	"server-cert":             {"server-cert"},
	"intermediate request":    {"intermediate.key", "intermediate.request", "intermediate.attest", "policy.approve"},
	"intermediate sign":       {"intermediate.sign", "intermediate.enrol"},
	"intermediate install":    {"intermediate.install"},
	"intermediate confirm":    {"intermediate.confirm"},
	"attest":                  {"attest", "attest.respond"},
	"verify-attestation":      {"verify-attestation", "verify-attestation.activation"},
	"policy approve":          {"policy.approve"},
	"policy revoke":           {"policy.revoke"},
	"policy authority create": nil, // an offline key for no ceremony directory; it is never overwritten
	"policy quote":            nil, // reads the TPM's PCRs for the approver
	"status":                  nil, // reads
	"doctor":                  nil, // reads
	"fleet check":             nil, // reads
	"log init":                nil, // writes log.pub into the log directory, no ceremony directory; an interrupted run resumes with --reuse-key
	"log verify":              nil, // reads
	"log prove":               nil, // reads
	"log witness":             nil, // keeps the cosigned checkpoints in its own --state directory, not a ceremony directory
}

// TestEveryCommandHasItsOperations: every command the CLI can run is
// listed above (a new command fails here until its receipts are
// named), every name listed is one of keystore's operations, and every
// keystore operation is reachable from some command.
func TestEveryCommandHasItsOperations(t *testing.T) {
	known := keystore.Operations()
	if distinct := slices.Compact(slices.Sorted(slices.Values(known))); len(distinct) != len(known) {
		t.Errorf("keystore.Operations() names an operation twice: %v", known)
	}
	commands := runnableCommands(newRoot(defaultEnvironment(), io.Discard, io.Discard))
	reached := map[keystore.Operation]bool{}
	for _, path := range commands {
		ops, ok := commandOperations[path]
		if !ok {
			t.Errorf("command %q is not in commandOperations: name the receipt operations it writes (keystore/operation.go), or nil with the reason it writes none", path)
		}
		for _, op := range ops {
			if !slices.Contains(known, keystore.Operation(op)) {
				t.Errorf("command %q: %q is not a keystore operation", path, op)
			}
			reached[keystore.Operation(op)] = true
		}
	}
	for path := range commandOperations {
		if !slices.Contains(commands, path) {
			t.Errorf("commandOperations lists %q, which is no command", path)
		}
	}
	for _, op := range known {
		if !reached[op] {
			t.Errorf("keystore operation %q is written by no command", op)
		}
	}
}

// runnableCommands lists the paths ("trust add") of the commands under
// root that run something.
func runnableCommands(root *cobra.Command) []string {
	var out []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Runnable() && c.HasParent() {
			out = append(out, strings.TrimPrefix(c.CommandPath(), root.Name()+" "))
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	return out
}
