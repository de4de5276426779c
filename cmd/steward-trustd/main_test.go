package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
)

// TestCommandLine covers the command line only: every case ends before
// the daemon would serve.
func TestCommandLine(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none")
	tests := []struct {
		name   string
		args   []string
		env    map[string]string
		code   int
		stdout string
		stderr string
	}{
		{"version", []string{"--version"}, nil, cli.ExitOK, "steward-trustd version dev (go", ""},
		{"help", []string{"--help"}, nil, cli.ExitOK, "[$TRUSTD_SIGNER]", ""},
		{"completion", []string{"completion", "bash"}, nil, cli.ExitOK, "__start_steward-trustd", ""},
		{"positional", []string{"serve"}, nil, cli.ExitUsage, "", `unexpected argument "serve"`},
		{"unknown flag", []string{"--nope"}, nil, cli.ExitUsage, "", "unknown flag: --nope"},
		{"bad flag value", []string{"--port", "x"}, nil, cli.ExitUsage, "", `"x" is not a TCP port (--port / $TRUSTD_PORT)`},
		{"bad variable", nil, map[string]string{"TRUSTD_PORT": "70000"}, cli.ExitUsage, "", "$TRUSTD_PORT"},
		{"relative cert dir", nil, map[string]string{"TRUSTD_CERT_DIR": "certs"}, cli.ExitUsage, "", "(--cert-dir / $TRUSTD_CERT_DIR)"},
		// A bare --debug does not swallow the next flag: the port is what fails.
		{"bare debug", []string{"--debug", "--port", "0"}, nil, cli.ExitUsage, "", `"0" is not a TCP port`},
		{"bare require-peer-ip", []string{"-require-peer-ip", "-port=0"}, nil, cli.ExitUsage, "", `"0" is not a TCP port`},
		{"debug not a bool", []string{"--debug=maybe"}, nil, cli.ExitUsage, "", "--debug"},
		{"signer fails", []string{"--cert-dir", missing, "--listen-address", "127.0.0.1", "--port", "1"}, nil, cli.ExitFailed, "", "key not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }
			var out, errb bytes.Buffer
			// Bounded, should a reordered start-up ever reach serving.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			code := run(ctx, tt.args, &out, &errb, getenv)
			if code != tt.code {
				t.Fatalf("exit %d, want %d; stderr %s", code, tt.code, errb.String())
			}
			if !strings.Contains(out.String(), tt.stdout) || !strings.Contains(errb.String(), tt.stderr) {
				t.Errorf("stdout %q / stderr %q, want %q / %q", out.String(), errb.String(), tt.stdout, tt.stderr)
			}
		})
	}
}

// TestHelpShowsNoSecrets: flags have no environment-derived defaults, so
// --help never prints the token or a key given in the environment.
func TestHelpShowsNoSecrets(t *testing.T) {
	secrets := map[string]string{"TRUSTD_TOKEN": "tok-s3cret-4242", "TRUSTD_OS_CA_KEY": "a2V5LXMzY3JldC00MjQy", "TRUSTD_SERVER_KEY": "c2VydmVyLXMzY3JldA=="}
	getenv := func(k string) (string, bool) { v, ok := secrets[k]; return v, ok }
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, &out, &errb, getenv); code != cli.ExitOK {
		t.Fatalf("--help exit %d: %s", code, errb.String())
	}
	for name, v := range secrets {
		if strings.Contains(out.String()+errb.String(), v) {
			t.Errorf("--help shows $%s", name)
		}
	}
}
