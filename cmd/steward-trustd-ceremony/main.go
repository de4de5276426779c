// Command steward-trustd-ceremony is the OS CA key ceremony of
// steward-trustd: it creates or imports the CA key on a TPM, a PKCS#11
// HSM or (explicitly) a file, and issues everything that used to need the
// key file: talosctl client certificates and talosconfigs, trustd's
// serving certificate, CA rotations. See keystore/README.md.
//
// Exit codes: 0 success, 1 the operation failed, 2 usage error.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/harden"
	"github.com/steward-trustd/steward-trustd/signer"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// Before anything reads a token, a PIN or a key.
	harden.AtStart(os.Stderr, "steward-trustd-ceremony")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, nil)
	stop()
	os.Exit(code)
}

// run executes one command; env overrides the process environment in
// tests (nil means the real one).
func run(ctx context.Context, args []string, stdout, stderr io.Writer, env *environment) int {
	if env == nil {
		env = defaultEnvironment()
	}
	code := cli.Run(ctx, newRoot(env, stdout, stderr), args, stdout, stderr)
	if line := env.warnings.line(); line != "" {
		fmt.Fprintln(stderr, line)
	}
	return code
}

func newRoot(env *environment, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "steward-trustd-ceremony",
		Short: "Create, import and use the Talos OS CA key on a TPM, a PKCS#11 HSM or a file",
		Long: `steward-trustd-ceremony manages the Talos OS CA whose private key lives on a device.
Keys are named by URI: tpm:path=/var/lib/ca.tpmkey;pcrs=7, tpm:handle=0x81000100,
pkcs11:token=ca;object=os-ca?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=/run/pin,
or file:/etc/steward-trustd/certs/os-ca.key.

Long flags may be written with one dash or two (-out DIR, --out DIR).
Exit codes: 0 success, 1 the operation failed, 2 usage error.`,
	}
	root.AddCommand(
		initCmd(env, stdout, stderr),
		importCmd(env, stdout, stderr),
		signCSRCmd(env, stdout, stderr),
		talosconfigCmd(env, stdout, stderr),
		serverCertCmd(env, stdout, stderr),
		rotateCmd(env, stdout, stderr),
		trustCmd(env, stdout, stderr),
		fleetCmd(stdout),
		intermediateCmd(env, stdout, stderr),
		statusCmd(env, stdout, stderr),
		attestCmd(env, stdout, stderr),
		verifyAttestationCmd(env, stdout, stderr),
		policyCmd(env, stdout, stderr),
		doctorCmd(stdout),
		logCmd(env, stdout, stderr),
	)
	// Messages about a key (a file key's warning) name its role.
	root.PersistentPreRun = func(cmd *cobra.Command, _ []string) {
		if role := keyRole(cmd); role != "" {
			cmd.SetContext(signer.WithKeyRole(cmd.Context(), role))
		}
	}
	cli.Setup(root, version)
	return root
}

// keyRole is the role of the key a command's --signer (or --new-signer,
// --authority) names; "" where it may be either (status).
func keyRole(cmd *cobra.Command) signer.KeyRole {
	parent := ""
	if cmd.HasParent() {
		parent = cmd.Parent().Name()
	}
	switch {
	case parent == "intermediate" && cmd.Name() != "sign":
		return signer.RoleIntermediate
	case cmd.Name() == "rotate" && rotatesIntermediate(cmd):
		return signer.RoleIntermediate
	case parent == "policy":
		return signer.RoleAuthority
	case parent == "log" && cmd.Name() == "witness":
		return signer.RoleLogWitness
	case parent == "log":
		return signer.RoleIssuanceLog
	case cmd.Name() == "status" || cmd.Name() == "doctor":
		return ""
	}
	return signer.RoleOSCA
}

// rotatesIntermediate reports rotate --intermediate.
func rotatesIntermediate(cmd *cobra.Command) bool {
	v, err := cmd.Flags().GetBool("intermediate")
	return err == nil && v
}
