package keystore_test

import (
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v4"

	"github.com/steward-trustd/steward-trustd/keystore"
)

// TestTalosWorkerSecrets: the worker secrets file keeps every secret but
// certs.os, whose throwaway pair is a parseable, matching, labelled CA
// that import itself refuses to take for an OS CA.
func TestTalosWorkerSecrets(t *testing.T) {
	src, token := talosSecrets(t)
	out, err := keystore.TalosWorkerSecrets(src, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var before, after map[string]map[string]any
	if err := yaml.Unmarshal(src, &before); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(out, &after); err != nil {
		t.Fatal(err)
	}
	for section, fields := range before {
		for k, v := range fields {
			if section == "certs" && k == "os" {
				continue
			}
			if !equalYAML(t, v, after[section][k]) {
				t.Errorf("%s.%s changed", section, k)
			}
		}
	}
	if !strings.Contains(string(out), "THROWAWAY pair") || !strings.Contains(string(out), token) {
		t.Errorf("no label above certs.os, or the token is gone:\n%s", out)
	}
	_, err = keystore.ParseTalosSecrets(out)
	if err == nil || !strings.Contains(err.Error(), "throwaway") {
		t.Errorf("importing the worker secrets file: %v, want a refusal naming the throwaway pair", err)
	}
	if !keystore.IsTalosWorkerSecrets(out, src) || keystore.IsTalosWorkerSecrets(src, src) {
		t.Error("IsTalosWorkerSecrets does not tell the worker secrets file from its source")
	}
	for _, bad := range []string{"", "certs: {}", "- a list", "a: 1\n---\nb: 2\n"} {
		if _, err := keystore.TalosWorkerSecrets([]byte(bad), time.Now(), rand.Reader); err == nil {
			t.Errorf("TalosWorkerSecrets(%q) accepted", bad)
		}
	}
}

// equalYAML compares two decoded YAML values by their encoding.
func equalYAML(t *testing.T, a, b any) bool {
	t.Helper()
	ea, err := yaml.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := yaml.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(ea) == string(eb)
}

func TestWriteTalosWorkerSecrets(t *testing.T) {
	src, _ := talosSecrets(t)
	path := filepath.Join(t.TempDir(), "secrets-for-workers.yaml")
	write := func(force bool) (bool, error) {
		return keystore.WriteTalosWorkerSecrets(path, src, force, time.Now(), rand.Reader)
	}
	if kept, err := write(false); err != nil || kept {
		t.Fatalf("first write: kept %v, %v", kept, err)
	}
	first := readFile(t, path)
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	// A repeated or resumed import keeps the file: one throwaway pair.
	if kept, err := write(false); err != nil || !kept || string(readFile(t, path)) != string(first) {
		t.Fatalf("second write: kept %v, %v", kept, err)
	}
	if err := os.WriteFile(path, []byte("other: file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := write(false); !errors.Is(err, keystore.ErrExists) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("foreign file: %v, want ErrExists with the way out", err)
	}
	if _, err := write(true); err != nil || !keystore.IsTalosWorkerSecrets(readFile(t, path), src) {
		t.Fatalf("--force: %v", err)
	}
}
