package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// TestConfigDiffIDs reads the layout back from disk, as a runtime does,
// and checks each platform's config names exactly its layers: rootfs.type
// "layers", one diff_id per manifest layer, each the sha256 of that
// layer's uncompressed bytes (hashed here, not taken from the library).
// containerd refuses an image whose diff_ids do not match its layers.
func TestConfigDiffIDs(t *testing.T) {
	out := filepath.Join(t.TempDir(), "image")
	s := spec{out: out, tag: "test", bins: platformBins{{"linux", "amd64", fakeBins(t)}}, created: time.Unix(0, 0)}
	if err := build(s, io.Discard); err != nil {
		t.Fatal(err)
	}
	idx, err := layout.ImageIndexFromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	img, err := platformOf(idx, "test", "amd64")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		RootFS struct {
			Type    string   `json:"type"`
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RootFS.Type != "layers" || len(cfg.RootFS.DiffIDs) != len(layers) || len(layers) == 0 {
		t.Fatalf("rootfs %+v for %d layers: want type layers and one diff_id per layer", cfg.RootFS, len(layers))
	}
	for i, l := range layers {
		if got, want := cfg.RootFS.DiffIDs[i], uncompressedDigest(t, l); got != want {
			t.Errorf("diff_ids[%d] = %s, want the layer's uncompressed digest %s", i, got, want)
		}
	}
}

// fakeBins is a directory holding the image's commands: copies of this
// test binary (any ELF of the build machine's architecture will do).
func fakeBins(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range binaries {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func uncompressedDigest(t *testing.T, l v1.Layer) string {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	h := sha256.New()
	if _, err := io.Copy(h, rc); err != nil {
		t.Fatal(err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}
