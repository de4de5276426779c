package main

// The issuance log commands: log init, log verify, log prove.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/atomicfile"
	"github.com/steward-trustd/steward-trustd/internal/issuelog"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

func logCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	c := &cobra.Command{
		Use:   "log",
		Short: "Create, verify and prove the tamper-evident issuance log",
		Long: `The daemon appends every certificate it issues (and every refusal of an
authenticated request) to an append-only Merkle-tree log in its log
directory, and signs checkpoints with a log key of its own, never the CA key.
Owners pin the log key's verifier (log init prints it) and check the log
with log verify; log prove shows that one certificate is in it.`,
	}
	c.AddCommand(logInitCmd(env, stdout, stderr), logVerifyCmd(stdout), logProveCmd(stdout), logWitnessCmd(env, stdout, stderr))
	return c
}

func logInitCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var f struct {
		signer, dir, name, ca string
		reuse, force          bool
		k                     keyFlags
	}
	c := &cobra.Command{
		Use:   "init --signer LOG_KEY_URI --log DIR",
		Short: "Create the log key on its device and write the log's verifier key (DIR/log.pub)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Required(map[string]string{"signer": f.signer, "log": f.dir}); err != nil {
				return err
			}
			uri, alg, err := f.k.key(f.signer)
			if err != nil {
				return err
			}
			s, err := logKey(cmd.Context(), env, stderr, uri, alg, f.reuse)
			if err != nil {
				return err
			}
			defer func() { _ = s.Close() }() // the key is written; a close error changes nothing
			if err := notTheCA(s, f.ca); err != nil {
				return err
			}
			return writeLogKey(stdout, s, f.dir, f.name, f.force)
		},
	}
	c.Flags().StringVar(&f.signer, "signer", "", "key URI of the log key (its own TPM key, PKCS#11 object or file; never the CA key)")
	c.Flags().StringVar(&f.dir, "log", "", "the daemon's log directory (TRUSTD_LOG_DIR); log.pub is written there")
	c.Flags().StringVar(&f.name, "name", "", "the log's name, the checkpoints' origin (default steward-trustd/HOSTNAME)")
	c.Flags().StringVar(&f.ca, "ca", "", "os-ca.crt (or issuer.crt): refuse if the log key is the CA key")
	c.Flags().BoolVar(&f.reuse, "reuse-key", false, "use an existing key at --signer instead of creating one")
	c.Flags().BoolVar(&f.force, "force", false, "replace an existing log.pub (the old checkpoints no longer verify under the new key)")
	f.k.register(c, "log key algorithm: p256 (TPMs, HSMs) or ed25519; p384", "TPM PCRs the log key is bound to (its own policy)")
	return c
}

// logKey creates the log key, or opens an existing one with --reuse-key.
func logKey(ctx context.Context, env *environment, stderr io.Writer, uri string, alg signer.Algorithm, reuse bool) (signer.Signer, error) {
	keys, err := env.keys(env.warnings.logger(stderr))
	if err != nil {
		return nil, err
	}
	if reuse {
		return keys.Open(ctx, uri)
	}
	s, err := keys.Generate(ctx, uri, alg)
	if errors.Is(err, signer.ErrKeyExists) {
		return nil, fmt.Errorf("log init: %w at %s: pass --reuse-key to make it the log key", err, uri)
	}
	return s, err
}

// notTheCA refuses a log key that certifies workers too: checkpoints and
// certificates must be signatures of different keys.
func notTheCA(s signer.Signer, caFile string) error {
	if caFile == "" {
		return nil
	}
	data, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	certs, err := pki.ParseCertificates(data)
	if err != nil {
		return fmt.Errorf("--ca: %w", err)
	}
	for _, c := range certs {
		if pki.KeyMatchesCert(s.Public(), c) {
			return fmt.Errorf("log init: the log key is the key of %q in %s: the log needs a key of its own (a different signature domain); create one with a new --signer URI", c.Subject, caFile)
		}
	}
	return nil
}

func writeLogKey(stdout io.Writer, s signer.Signer, dir, name string, force bool) error {
	if name == "" {
		host, _ := os.Hostname()
		name = "steward-trustd/" + host
	}
	ns, err := issuelog.NewNoteSigner(name, s)
	if err != nil {
		return cli.Usage(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, issuelog.FileVerifier)
	if err := atomicfile.Write(path, []byte(ns.Verifier()+"\n"), 0o644, force); err != nil {
		return fmt.Errorf("log init: write %s: %w (pass --force to replace it)", path, err)
	}
	d := s.Describe()
	fmt.Fprintf(stdout, "log key: %s %s (%s), SHA-256 %s\n", d.Backend, d.Algorithm, d.Location, d.Fingerprint)
	if d.Policy != "" {
		fmt.Fprintf(stdout, "log key policy: %s\n", d.Policy)
	}
	fmt.Fprintf(stdout, "verifier key (pin it; log verify --key): %s\n", ns.Verifier())
	fmt.Fprintf(stdout, "wrote %s; start the daemon with TRUSTD_LOG_DIR=%s TRUSTD_LOG_KEY=<the --signer URI>\n", path, dir)
	return nil
}

// logSource is where log verify and log prove read a log.
type logSource struct {
	log, key    string
	checkpoints []string
}

func (o *logSource) register(c *cobra.Command) {
	c.Flags().StringVar(&o.log, "log", "", "the log: its directory, or the URL the daemon serves it at (http://HOST:PORT/log)")
	c.Flags().StringVar(&o.key, "key", "", "the pinned verifier key: a file (log.pub) or the key itself")
	cli.ListVar(c.Flags(), &o.checkpoints, "checkpoint", nil, "checkpoints saved earlier (by you or a witness) to check the log against; repeatable")
}

// snapshot reads the log and adds the saved checkpoints.
func (o *logSource) snapshot(ctx context.Context) (*issuelog.Snapshot, string, error) {
	if err := cli.Required(map[string]string{"log": o.log, "key": o.key}); err != nil {
		return nil, "", err
	}
	vkey := o.key
	if b, err := os.ReadFile(o.key); err == nil {
		vkey = strings.TrimSpace(string(b))
	}
	var s *issuelog.Snapshot
	var err error
	if strings.HasPrefix(o.log, "http://") || strings.HasPrefix(o.log, "https://") {
		s, err = issuelog.Fetch(ctx, &http.Client{Timeout: 30 * time.Second}, o.log)
	} else {
		s, err = issuelog.ReadDir(o.log)
	}
	if err != nil {
		return nil, "", err
	}
	for _, p := range o.checkpoints {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, "", err
		}
		s.Checkpoints[p] = b
	}
	return s, vkey, nil
}

func logVerifyCmd(stdout io.Writer) *cobra.Command {
	var o logSource
	c := &cobra.Command{
		Use:   "verify --log DIR|URL --key LOG_PUB",
		Short: "Recompute the log's tree, check every checkpoint and their consistency, and lint every certificate in it",
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, vkey, err := o.snapshot(cmd.Context())
			if err != nil {
				return err
			}
			r, err := issuelog.Verify(s, vkey)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "log: %d entries (%d certificates), %d checkpoints, latest size %d root %s\n", r.Entries, r.Issued, r.Checkpoints, r.Latest.Size, r.Latest.Root)
			for _, p := range r.Problems {
				fmt.Fprintln(stdout, "PROBLEM:", p)
			}
			if !r.OK() {
				return fmt.Errorf("log verify: %d problem(s): the log is not what its key signed; keep a copy and investigate the host", len(r.Problems))
			}
			fmt.Fprintln(stdout, "ok: every checkpoint is signed by the pinned key and consistent with the entries")
			return nil
		},
	}
	o.register(c)
	return c
}

func logProveCmd(stdout io.Writer) *cobra.Command {
	var o logSource
	var certFile string
	c := &cobra.Command{
		Use:   "prove --cert FILE --log DIR|URL --key LOG_PUB",
		Short: "Print an inclusion proof of one certificate under the log's latest checkpoint",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Required(map[string]string{"cert": certFile}); err != nil {
				return err
			}
			in, err := prove(cmd.Context(), o, certFile)
			if err != nil {
				return err
			}
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(in)
		},
	}
	c.Flags().StringVar(&certFile, "cert", "", "the certificate (PEM; the first one of the file)")
	o.register(c)
	return c
}

func prove(ctx context.Context, o logSource, certFile string) (*issuelog.Inclusion, error) {
	data, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	certs, err := pki.ParseCertificates(data)
	if err != nil {
		return nil, fmt.Errorf("--cert: %w", err)
	}
	s, vkey, err := o.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	idx, _, err := issuelog.Find(s, certs[0].Raw)
	if err != nil {
		return nil, err
	}
	r, err := issuelog.Verify(s, vkey)
	if err != nil {
		return nil, err
	}
	if !r.OK() {
		return nil, fmt.Errorf("log prove: the log does not verify (%s): run log verify", r.Problems[0])
	}
	return issuelog.Prove(s, idx, r.Latest)
}

func logWitnessCmd(env *environment, stdout, stderr io.Writer) *cobra.Command {
	var o logSource
	var f struct {
		signer, name, state string
		create              bool
	}
	c := &cobra.Command{
		Use:   "witness --log DIR|URL --key LOG_PUB --signer WITNESS_KEY_URI --name NAME --state DIR",
		Short: "Cosign another replica's log checkpoint (C2SP cosignature/v1) after checking it against every checkpoint cosigned before",
		Long: `log witness is run by one replica's operator against another replica's log. It
verifies the log with its pinned key and against every checkpoint it cosigned before
(kept in --state), so a log rewritten, cut or forked since is refused; then it
cosigns the latest checkpoint with an Ed25519 witness key and prints it. Owners
check the cosignature with the witness's verifier key (printed on stderr).`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Required(map[string]string{"signer": f.signer, "name": f.name, "state": f.state}); err != nil {
				return err
			}
			s, vkey, err := o.snapshot(cmd.Context())
			if err != nil {
				return err
			}
			key, err := witnessKey(cmd.Context(), env, stderr, f.signer, f.create)
			if err != nil {
				return err
			}
			defer func() { _ = key.Close() }() // only read and signed with
			w, err := issuelog.NewCosigner(f.name, key, env.clock)
			if err != nil {
				return cli.Usage(err)
			}
			out, r, err := issuelog.Witness(s, vkey, w, f.state)
			if err != nil {
				return err
			}
			fmt.Fprintf(stderr, "cosigned the checkpoint of size %d (%d checkpoints consistent); witness verifier key: %s\n", r.Latest.Size, r.Checkpoints, w.Verifier())
			_, err = stdout.Write(out)
			return err
		},
	}
	o.register(c)
	c.Flags().StringVar(&f.signer, "signer", "", "key URI of the witness's Ed25519 key (file: or pkcs11:; TPMs hold no Ed25519)")
	c.Flags().StringVar(&f.name, "name", "", "the witness's name in its cosignatures, e.g. steward-trustd/node-b")
	c.Flags().StringVar(&f.state, "state", "", "directory keeping the checkpoints this witness cosigned")
	c.Flags().BoolVar(&f.create, "create", false, "create the Ed25519 witness key at --signer first")
	return c
}

// witnessKey opens the witness key, or creates it with --create.
func witnessKey(ctx context.Context, env *environment, stderr io.Writer, uri string, create bool) (signer.Signer, error) {
	keys, err := env.keys(env.warnings.logger(stderr))
	if err != nil {
		return nil, err
	}
	if create {
		return keys.Generate(ctx, uri, signer.Ed25519)
	}
	return keys.Open(ctx, uri)
}
