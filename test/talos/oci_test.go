package talos

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ociDescriptor, ociIndex and ociManifest are the parts of the OCI image
// spec (image-spec v1.1: descriptor.md, image-index.md, manifest.md) the
// unpacker reads; it uses only the standard library so that it checks the
// layout independently of the library that wrote it.
type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Annotations map[string]string `json:"annotations"`
	Platform    *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform"`
}

type ociIndex struct {
	Manifests []ociDescriptor `json:"manifests"`
}

type ociManifest struct {
	Config ociDescriptor   `json:"config"`
	Layers []ociDescriptor `json:"layers"`
}

// ociConfig is the part of the image configuration the test checks.
type ociConfig struct {
	Architecture string `json:"architecture"`
	Config       struct {
		User       string   `json:"User"`
		Entrypoint []string `json:"Entrypoint"`
	} `json:"config"`
}

// readBlob decodes the JSON blob d of the layout in dir.
func readBlob(t *testing.T, dir string, d ociDescriptor, v any) {
	t.Helper()
	alg, hex, ok := strings.Cut(d.Digest, ":")
	if !ok || alg != "sha256" {
		t.Fatalf("digest %q", d.Digest)
	}
	b, err := os.ReadFile(filepath.Join(dir, "blobs", alg, hex))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", d.Digest, err)
	}
}

// platformManifest finds the manifest for linux/arch under the tag.
func platformManifest(t *testing.T, dir, tag, arch string) ociManifest {
	t.Helper()
	var top, idx ociIndex
	readBlobFile(t, filepath.Join(dir, "index.json"), &top)
	var tagged *ociDescriptor
	for i, m := range top.Manifests {
		if m.Annotations["org.opencontainers.image.ref.name"] == tag {
			tagged = &top.Manifests[i]
		}
	}
	if tagged == nil {
		t.Fatalf("no image tagged %q in %s", tag, dir)
	}
	readBlob(t, dir, *tagged, &idx)
	for _, m := range idx.Manifests {
		if m.Platform != nil && m.Platform.OS == "linux" && m.Platform.Architecture == arch {
			var man ociManifest
			readBlob(t, dir, m, &man)
			return man
		}
	}
	t.Fatalf("no linux/%s manifest in the index", arch)
	return ociManifest{}
}

func readBlobFile(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// unpackLayers extracts the gzip tar layers of man into root, in order.
func unpackLayers(t *testing.T, dir string, man ociManifest, root string) {
	t.Helper()
	for _, l := range man.Layers {
		if l.MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
			t.Fatalf("layer media type %q", l.MediaType)
		}
		_, hex, _ := strings.Cut(l.Digest, ":")
		if err := untarGz(filepath.Join(dir, "blobs", "sha256", hex), root); err != nil {
			t.Fatal(err)
		}
	}
}

func untarGz(path, root string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := extract(tr, h, root); err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
	}
}

// extract writes one tar entry below root, refusing names that leave it.
func extract(r io.Reader, h *tar.Header, root string) error {
	if !filepath.IsLocal(h.Name) {
		return fmt.Errorf("path leaves the root")
	}
	p := filepath.Join(root, h.Name)
	switch h.Typeflag {
	case tar.TypeDir:
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		return os.Chmod(p, os.FileMode(h.Mode&0o777)|modeBits(h.Mode))
	case tar.TypeSymlink:
		return os.Symlink(h.Linkname, p)
	case tar.TypeReg:
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(h.Mode&0o777))
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, r); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	return fmt.Errorf("unexpected tar entry type %q", h.Typeflag)
}

func modeBits(m int64) os.FileMode {
	if m&0o1000 != 0 {
		return os.ModeSticky
	}
	return 0
}
