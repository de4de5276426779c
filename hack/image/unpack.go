package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// unpack extracts the root file system of the image tagged tag for
// linux/arch from the OCI layout dir into root (for make image-smoke).
func unpack(dir, tag, arch, root string) error {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return err
	}
	img, err := platformOf(idx, tag, arch)
	if err != nil {
		return err
	}
	rc := mutate.Extract(img)
	// Closing the reader of the export stops its writer; what was read
	// was checked by tar already.
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := extractEntry(tr, h, root); err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
	}
}

// platformOf finds linux/arch in the index tagged tag.
func platformOf(top v1.ImageIndex, tag, arch string) (v1.Image, error) {
	m, err := top.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, d := range m.Manifests {
		if d.Annotations["org.opencontainers.image.ref.name"] != tag {
			continue
		}
		idx, err := top.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, err
		}
		for _, p := range im.Manifests {
			if p.Platform != nil && p.Platform.OS == "linux" && p.Platform.Architecture == arch {
				return idx.Image(p.Digest)
			}
		}
	}
	return nil, fmt.Errorf("no linux/%s image tagged %q", arch, tag)
}

func extractEntry(r io.Reader, h *tar.Header, root string) error {
	if !filepath.IsLocal(h.Name) {
		return errors.New("path leaves the root")
	}
	p := filepath.Join(root, h.Name)
	switch h.Typeflag {
	case tar.TypeDir:
		return os.MkdirAll(p, 0o755)
	case tar.TypeSymlink:
		return os.Symlink(h.Linkname, p)
	case tar.TypeReg:
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(h.Mode&0o777))
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		return errors.Join(err, f.Close())
	}
	return fmt.Errorf("unexpected tar entry type %q", h.Typeflag)
}
