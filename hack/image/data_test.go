package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// TestDataImage builds a module image (what make e2e mounts as the pkcs11
// overlay's image volume) from a tree made writable on purpose and reads
// the layout back: every entry root-owned and read-only, symlinks kept,
// contents intact, one diff_id per layer, and no entrypoint.
func TestDataImage(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir)
	out := filepath.Join(t.TempDir(), "module")
	if err := buildData(dataSpec{dir: dir, out: out, tag: "2.6.1", arch: "amd64", created: time.Unix(0, 0)}); err != nil {
		t.Fatal(err)
	}
	got := readLayer(t, out, "2.6.1")
	want := map[string]struct {
		typ  byte
		mode int64
		body string
	}{
		"lib/":                  {tar.TypeDir, 0o555, ""},
		"lib/libvendor.so":      {tar.TypeReg, 0o555, "\x7fELF module"},
		"lib/libvendor.so.1":    {tar.TypeSymlink, 0o777, ""},
		"etc/":                  {tar.TypeDir, 0o555, ""},
		"etc/softhsm2.conf":     {tar.TypeReg, 0o444, "directories.tokendir = /opt/hsm/tokens\n"},
		"tokens/":               {tar.TypeDir, 0o555, ""},
		"tokens/t/":             {tar.TypeDir, 0o555, ""},
		"tokens/t/token.object": {tar.TypeReg, 0o444, "token"},
	}
	if len(got) != len(want) {
		t.Errorf("layer has %d entries, want %d: %v", len(got), len(want), got)
	}
	for name, w := range want {
		g, ok := got[name]
		switch {
		case !ok:
			t.Errorf("%s missing", name)
		case g.hdr.Typeflag != w.typ || g.hdr.Mode != w.mode || g.hdr.Uid != 0 || g.hdr.Gid != 0 || string(g.data) != w.body:
			t.Errorf("%s: type %c mode %o uid %d gid %d body %q; want type %c mode %o, root, body %q",
				name, g.hdr.Typeflag, g.hdr.Mode, g.hdr.Uid, g.hdr.Gid, g.data, w.typ, w.mode, w.body)
		}
	}
	if l := got["lib/libvendor.so.1"].hdr.Linkname; l != "libvendor.so" {
		t.Errorf("symlink target %q, want libvendor.so", l)
	}
}

// TestDataImageRefuses: an empty tree, an unknown architecture and a
// device-like entry (here a FIFO) are errors, not an image.
func TestDataImageRefuses(t *testing.T) {
	fifo := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(fifo, "pipe"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]dataSpec{
		"empty tree":   {dir: t.TempDir(), arch: "amd64"},
		"unknown arch": {dir: fifo, arch: "s390x"},
		"fifo":         {dir: fifo, arch: "amd64"},
	} {
		s.out, s.tag = filepath.Join(t.TempDir(), "out"), "x"
		if err := buildData(s); err == nil {
			t.Errorf("%s: built an image, want an error", name)
		}
	}
}

func writeTree(t *testing.T, dir string) {
	t.Helper()
	for _, f := range []struct {
		name, body string
		mode       os.FileMode
	}{
		{"lib/libvendor.so", "\x7fELF module", 0o775},
		{"etc/softhsm2.conf", "directories.tokendir = /opt/hsm/tokens\n", 0o666},
		{"tokens/t/token.object", "token", 0o600},
	} {
		p := filepath.Join(dir, f.name)
		if err := os.MkdirAll(filepath.Dir(p), 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.body), f.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("libvendor.so", filepath.Join(dir, "lib/libvendor.so.1")); err != nil {
		t.Fatal(err)
	}
}

type tarEntry struct {
	hdr  *tar.Header
	data []byte
}

// readLayer reads the amd64 image tagged tag from the layout out and
// returns its entries by name, after checking its config's diff_ids.
func readLayer(t *testing.T, out, tag string) map[string]tarEntry {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	img, err := platformOf(idx, tag, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 || len(cfg.RootFS.DiffIDs) != 1 || "sha256:"+cfg.RootFS.DiffIDs[0].Hex != uncompressedDigest(t, layers[0]) {
		t.Fatalf("want one layer and its diff_id, got %d layers, diff_ids %v", len(layers), cfg.RootFS.DiffIDs)
	}
	if len(cfg.Config.Entrypoint) != 0 || cfg.Config.User != "" {
		t.Errorf("a data image has no entrypoint and no user, got %v, %q", cfg.Config.Entrypoint, cfg.Config.User)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]tarEntry{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = tarEntry{h, b}
	}
}
