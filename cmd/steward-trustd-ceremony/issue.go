package main

// The issuing commands: sign-csr, talosconfig, server-cert. They share
// issueFlags and one runner, so the CA, the receipt directory and the
// validity bound are handled the same way by all three.

import (
	"context"
	"crypto/x509"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/keystore"
)

// issueFlags are the flags every issuing command has.
type issueFlags struct {
	signer   string
	ca       string
	out      string
	dir      string
	validity time.Duration
	force    bool
}

// register adds the common flags; caUsage, outUsage and forceUsage say
// what the CA, --out and --force mean for this command.
func (f *issueFlags) register(cmd *cobra.Command, caUsage, outUsage, forceUsage string) {
	fs := cmd.Flags()
	fs.StringVar(&f.signer, "signer", "", "CA key URI")
	fs.StringVar(&f.ca, "ca", "", caUsage)
	cli.HoursVar(fs, &f.validity, "hours", 8760, cli.MaxLeafHours, "validity in hours")
	fs.StringVar(&f.out, "out", "", outUsage)
	fs.StringVar(&f.dir, "dir", "", "ceremony directory for the receipt (default: the directory of --ca)")
	fs.BoolVar(&f.force, "force", false, forceUsage)
}

// required checks the common required flags and the command's own.
func (f *issueFlags) required(more map[string]string) error {
	flags := map[string]string{"signer": f.signer, "ca": f.ca, "out": f.out}
	for k, v := range more {
		flags[k] = v
	}
	return cli.Required(flags)
}

// issueOp is one issuing operation of the ceremony.
type issueOp func(ctx context.Context, cer *keystore.Ceremony, receipts keystore.Dir) (*keystore.Outcome, error)

// run runs op with its receipt in --dir (default: the directory of --ca)
// and prints the outcome.
func (f *issueFlags) run(cmd *cobra.Command, env *environment, stdout, stderr io.Writer, op issueOp) error {
	rd, err := receiptsDir(f.dir, f.ca)
	if err != nil {
		return err
	}
	return env.runOp(stdout, stderr, func(cer *keystore.Ceremony) (*keystore.Outcome, error) {
		return op(cmd.Context(), cer, rd)
	})
}

func signCSRCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var f issueFlags
	var csrPath string
	var roles []string
	var override bool
	c := &cobra.Command{
		Use:   "sign-csr --signer URI --ca os-ca.crt --csr user.csr --roles ROLE[,..] --out user.crt",
		Short: "Sign a talosctl client certificate request",
		Long: `Sign a talosctl client certificate request with exactly the roles --roles grants.
--roles is required. When the request asks for roles (its Organization) and they differ
from --roles, sign-csr refuses unless --override-csr-roles says the difference is meant.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.required(map[string]string{"csr": csrPath}); err != nil {
				return err
			}
			if !cmd.Flags().Changed("roles") {
				return cli.Usagef("required flag(s) --roles not set: name the roles to grant, e.g. --roles os:reader (known: %s)", strings.Join(pki.KnownRoles(), ", "))
			}
			granted, err := parseRoles(roles)
			if err != nil {
				return err
			}
			o := keystore.SignCSROptions{SignerURI: f.signer, Roles: granted, Validity: f.validity, Force: f.force}
			if err := f.readSignCSR(&o, csrPath, override); err != nil {
				return err
			}
			return f.run(cmd, env, stdout, stderr, func(ctx context.Context, cer *keystore.Ceremony, rd keystore.Dir) (*keystore.Outcome, error) {
				_, res, err := cer.SignCSR(ctx, rd, o)
				return res, err
			})
		},
	}
	f.register(c, "CA certificate (os-ca.crt)", "certificate output file", "replace --out")
	c.Flags().StringVar(&csrPath, "csr", "", "PEM certificate request")
	cli.ListVar(c.Flags(), &roles, "roles", nil, "roles to grant (the certificate's Organization), required: "+strings.Join(pki.KnownRoles(), ", "))
	c.Flags().BoolVar(&override, "override-csr-roles", false, "grant --roles even though the request asks for different roles")
	return c
}

// readSignCSR reads the CA and the request into o and checks that the
// request asks for the roles o grants.
func (f *issueFlags) readSignCSR(o *keystore.SignCSROptions, csrPath string, override bool) error {
	var err error
	if o.CA, err = readCA(f.ca); err != nil {
		return err
	}
	var csr *x509.CertificateRequest
	if o.CSR, csr, err = readCSR(csrPath); err != nil {
		return err
	}
	if err := checkRequestedRoles(csr.Subject.Organization, o.Roles, override); err != nil {
		return err
	}
	o.Out, err = outTarget(f.out)
	return err
}

// checkRequestedRoles refuses to grant roles other than those a request
// asks for (talosctl gen csr --roles puts them in the Organization),
// unless override. A request that asks for none gets --roles.
func checkRequestedRoles(requested, granted []string, override bool) error {
	asked := slices.Compact(slices.Sorted(slices.Values(requested)))
	if len(asked) == 0 || override || slices.Equal(asked, slices.Sorted(slices.Values(granted))) {
		return nil
	}
	return cli.Usagef("the request asks for roles %s but --roles grants %s: re-run with --roles %s, or add --override-csr-roles to grant --roles anyway",
		strings.Join(asked, ","), strings.Join(granted, ","), strings.Join(asked, ","))
}

func talosconfigCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var f issueFlags
	var o keystore.TalosconfigOptions
	var roles []string
	c := &cobra.Command{
		Use:   "talosconfig --signer URI --ca os-ca.crt --context NAME --endpoints IP[,..] --out FILE",
		Short: "Generate a client key and write a talosconfig signed by the device",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.required(map[string]string{"context": o.Context}); err != nil {
				return err
			}
			if err := checkHosts("endpoints", o.Endpoints); err != nil {
				return err
			}
			var err error
			if o.Roles, err = parseRoles(roles); err != nil {
				return err
			}
			o.SignerURI, o.Validity, o.Force = f.signer, f.validity, f.force
			if err := f.readTalosconfig(&o); err != nil {
				return err
			}
			return f.run(cmd, env, stdout, stderr, func(ctx context.Context, cer *keystore.Ceremony, rd keystore.Dir) (*keystore.Outcome, error) {
				return cer.Talosconfig(ctx, rd, o)
			})
		},
	}
	f.register(c, "CA certificate that signs the client certificate (os-ca.crt, or os-ca.next.crt during a rotation)",
		"talosconfig output file (mode 0600)", "replace --out")
	fs := c.Flags()
	fs.StringVar(&o.Context, "context", "", "talosconfig context name")
	cli.ListVar(fs, &o.Endpoints, "endpoints", nil, "Talos API endpoints (IPs or names)")
	cli.ListVar(fs, &o.Nodes, "nodes", nil, "default nodes (default: the endpoints)")
	cli.ListVar(fs, &roles, "roles", []string{"os:admin"}, "roles: "+strings.Join(pki.KnownRoles(), ", "))
	fs.StringVar(&o.CommonName, "name", "talosctl", "client certificate common name")
	return c
}

// readTalosconfig reads the CA and the trust bundle next to it into o.
func (f *issueFlags) readTalosconfig(o *keystore.TalosconfigOptions) error {
	var err error
	if o.CA, err = readCA(f.ca); err != nil {
		return err
	}
	if o.Trust, err = certdir.ClientTrust(o.CA, certdir.OSDir(filepath.Dir(f.ca))); err != nil {
		return err
	}
	o.Out, err = outTarget(f.out)
	return err
}

func serverCertCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var f issueFlags
	var o keystore.ServerCertOptions
	c := &cobra.Command{
		Use:   "server-cert --signer URI --ca os-ca.crt --san IP|DNS[,..] --out DIR",
		Short: "Issue trustd's TLS serving certificate for the addresses workers dial",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.required(nil); err != nil {
				return err
			}
			if err := checkHosts("san", o.Hosts); err != nil {
				return err
			}
			o.SignerURI, o.Validity, o.Force = f.signer, f.validity, f.force
			var err error
			if o.CA, err = readCA(f.ca); err != nil {
				return err
			}
			if o.Out, err = mkdir(f.out); err != nil {
				return err
			}
			return f.run(cmd, env, stdout, stderr, func(ctx context.Context, cer *keystore.Ceremony, rd keystore.Dir) (*keystore.Outcome, error) {
				_, res, err := cer.ServerCert(ctx, rd, o)
				return res, err
			})
		},
	}
	f.register(c, "CA certificate (os-ca.crt)", "directory for server.crt and server.key", "replace server.crt and server.key")
	cli.ListVar(c.Flags(), &o.Hosts, "san", nil, "IP addresses and DNS names workers dial (every control-plane endpoint address, and its hostname)")
	return c
}
