package main

import (
	"io"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/keystore"
)

// trustCmd is `trust add|remove`: the root vouches for the CAs of
// accepted-cas.crt, which the daemon serves to workers only then.
func trustCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	c := &cobra.Command{
		Use:   "trust add|remove --signer ROOT_URI --ca os-ca.crt [--out DIR] CA.crt",
		Short: "Vouch with the root key for a CA in accepted-cas.crt (add), or stop vouching for it (remove)",
		Long: `Talos workers make trustd's ca bundle their apid's client-CA pool: whoever is in it can
administer the workers. steward-trustd therefore serves an accepted CA only when a statement signed
by the root key (accepted-cas.statement.json, beside accepted-cas.crt) names it. trust add puts
CA.crt into accepted-cas.crt and signs a new statement; trust remove takes it out and signs a new
statement without it. Every statement carries a sequence number one higher than the last, and a
running daemon refuses an older one, so a removed CA cannot be brought back by replaying an old
statement. DIR (default: the directory of --ca) is the ceremony directory; the Secret and the
worker patch are rewritten. rotate signs the statement for the new CA itself.`,
	}
	c.AddCommand(trustChangeCmd(env, stdout, stderr, false), trustChangeCmd(env, stdout, stderr, true))
	return c
}

func trustChangeCmd(env *environment, stdout, stderr io.Writer, remove bool) *cobra.Command {
	var signerURI, caPath, out string
	name, short := "add", "Add CA.crt to accepted-cas.crt and have the root key vouch for it"
	if remove {
		name, short = "remove", "Remove CA.crt from accepted-cas.crt and sign a statement without it"
	}
	c := &cobra.Command{
		Use:   name + " --signer ROOT_URI --ca os-ca.crt [--out DIR] CA.crt",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := cli.Required(map[string]string{"signer": signerURI, "ca": caPath}); err != nil {
				return err
			}
			if out == "" {
				out = filepath.Dir(caPath)
			}
			o := keystore.TrustOptions{SignerURI: signerURI, Remove: remove}
			var err error
			if o.Root, err = readCA(caPath); err != nil {
				return err
			}
			if o.CA, err = readCA(args[0]); err != nil {
				return err
			}
			return env.runOp(stdout, stderr, func(cer *keystore.Ceremony) (*keystore.Outcome, error) {
				return cer.Trust(cmd.Context(), keystore.OSDir{Root: out}, o)
			})
		},
	}
	f := c.Flags()
	f.StringVar(&signerURI, "signer", "", "key URI of the root (os-ca.crt's key); required")
	f.StringVar(&caPath, "ca", "", "the root certificate, os-ca.crt of the ceremony directory; required")
	f.StringVar(&out, "out", "", "ceremony directory (default: the directory of --ca)")
	return c
}
