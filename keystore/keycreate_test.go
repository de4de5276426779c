package keystore_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/file"
)

// writeIntent writes the intent record a run killed right after it
// would leave.
func writeIntent(t *testing.T, d keystore.OSDir, address string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"operation": "init.key", "address": address, "algorithm": "p256", "time": time.Now().UTC()})
	if err := d.WriteFile("receipts/init.key.intent", b, 0o644, false); err != nil {
		t.Fatal(err)
	}
}

// TestInitKeyRecovery: a key at the signer URI is resumed only when the
// directory vouches for it; an interrupted creation elsewhere blocks a
// second key.
func TestInitKeyRecovery(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		// intent is the address of the outstanding intent ("" none, "uri"
		// the URI of the run).
		intent  string
		haveKey bool
		wantErr error
	}{
		{"killed after the key was created", "uri", true, nil},
		{"killed before the key was created", "uri", false, nil},
		{"a key nobody recorded", "", true, keystore.ErrForeignKey},
		{"an interrupted creation elsewhere", "file:/elsewhere.key", false, keystore.ErrInterrupted},
		{"an interrupted creation elsewhere, a key here", "file:/elsewhere.key", true, keystore.ErrForeignKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCeremony(t)
			root := t.TempDir()
			keyPath := filepath.Join(root, "ca.key")
			uri := file.URI(keyPath)
			d := keystore.OSDir{Root: filepath.Join(root, "ceremony")}
			if tt.intent != "" {
				writeIntent(t, d, intentAddress(tt.intent, uri))
			}
			if tt.haveKey {
				if _, err := (&file.Backend{}).Generate(ctx, uri, signer.ECDSAP256); err != nil {
					t.Fatal(err)
				}
			}
			res, err := c.Init(ctx, d, keystore.InitOptions{SignerURI: uri, Cluster: "prod"})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				checkRefusedInit(t, err, keyPath, tt.haveKey)
				return
			}
			checkRecoveredInit(t, d, res, tt.haveKey)
		})
	}
}

// intentAddress resolves a test case's intent: "uri" stands for the URI
// of the run, anything else is an address of its own.
func intentAddress(intent, uri string) string {
	if intent == "uri" {
		return uri
	}
	return intent
}

// checkRefusedInit checks that a refused init kept a foreign key's
// signer.ErrKeyExists and left the key at keyPath as it was.
func checkRefusedInit(t *testing.T, err error, keyPath string, haveKey bool) {
	t.Helper()
	if errors.Is(err, keystore.ErrForeignKey) && !errors.Is(err, signer.ErrKeyExists) {
		t.Error("a foreign key error does not wrap signer.ErrKeyExists")
	}
	if _, serr := os.Stat(keyPath); serr == nil != haveKey {
		t.Error("a refused init changed the key at the signer URI")
	}
}

// checkRecoveredInit checks that an init which recovered an interrupted
// key creation says so (when the key existed), recorded both receipts and
// dropped the intent record.
func checkRecoveredInit(t *testing.T, d keystore.Dir, res *keystore.Outcome, haveKey bool) {
	t.Helper()
	if haveKey && !strings.Contains(strings.Join(res.Resumed, "\n"), "interrupted") {
		t.Errorf("resumed %v", res.Resumed)
	}
	if got := strings.Join(receiptOps(t, d), " "); got != "init.key init" {
		t.Errorf("receipts %s", got)
	}
	if ok, _ := d.Exists("receipts/init.key.intent"); ok {
		t.Error("the intent record is left")
	}
}

// TestKeyNotRecorded: when the key receipt cannot be written, the error
// says the key exists, and a re-run recognises it by its intent record.
func TestKeyNotRecorded(t *testing.T) {
	ctx := context.Background()
	c := newCeremony(t)
	root := t.TempDir()
	uri := file.URI(filepath.Join(root, "ca.key"))
	d := keystore.OSDir{Root: filepath.Join(root, "ceremony")}
	_, err := c.Init(ctx, receiptlessDir{d}, keystore.InitOptions{SignerURI: uri, Cluster: "prod"})
	var nr *keystore.KeyNotRecordedError
	if !errors.As(err, &nr) || nr.Fingerprint == "" {
		t.Fatalf("err = %v, want a KeyNotRecordedError", err)
	}
	res, err := c.Init(ctx, d, keystore.InitOptions{SignerURI: uri, Cluster: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Receipt.KeyFingerprint != nr.Fingerprint {
		t.Errorf("re-run used key %s, the first run created %s", res.Receipt.KeyFingerprint, nr.Fingerprint)
	}
}

// receiptlessDir fails every receipt write.
type receiptlessDir struct{ keystore.OSDir }

func (d receiptlessDir) WriteFile(name string, data []byte, perm os.FileMode, overwrite bool) error {
	if strings.HasSuffix(name, ".json") {
		return errors.New("disk full")
	}
	return d.OSDir.WriteFile(name, data, perm, overwrite)
}
