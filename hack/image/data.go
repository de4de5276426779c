package main

import (
	"archive/tar"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// dataSpec describes an image that is only files: what a Pod's `image`
// volume mounts (Kubernetes ImageVolume), e.g. a vendor's PKCS#11 module
// and the libraries it needs beyond the steward-trustd image, which the
// pkcs11 overlay mounts at /opt/hsm.
type dataSpec struct {
	dir     string // the tree that becomes the image's root
	out     string // the OCI layout to write (replaced)
	tag     string
	arch    string
	created time.Time
}

// buildData writes s.dir's tree as a one-layer, one-platform image: every
// entry owned by root and read-only to everyone (directories and
// executable files 0555, other files 0444: a mounted module must not be
// writable by the pod), symlinks kept, no entrypoint and no user.
func buildData(s dataSpec) error {
	a, ok := arches[s.arch]
	if !ok {
		return fmt.Errorf("-arch %q: supported are amd64 and arm64", s.arch)
	}
	entries, err := treeEntries(s.dir, s.created)
	if err != nil {
		return err
	}
	layerTar, err := tarOf(entries)
	if err != nil {
		return err
	}
	img, err := oneLayerImage(layerTar, func(diffIDs []v1.Hash) *v1.ConfigFile {
		return &v1.ConfigFile{Architecture: s.arch, OS: "linux", Variant: a.variant, Created: v1.Time{Time: s.created},
			RootFS: v1.RootFS{Type: "layers", DiffIDs: diffIDs}}
	})
	if err != nil {
		return err
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), mutate.IndexAddendum{Add: img,
		Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: s.arch, Variant: a.variant}}})
	return writeLayout(s.out, s.tag, idx)
}

// treeEntries are the tar entries of every directory, regular file and
// symlink under root, in walk (lexical) order; anything else is refused.
func treeEntries(root string, created time.Time) ([]entry, error) {
	var out []entry
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		name, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		e, err := treeEntry(p, filepath.ToSlash(name), d)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		e.hdr.ModTime, e.hdr.Format = created, tar.FormatPAX
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s is empty: put the files the image should hold there", root)
	}
	return out, nil
}

// treeEntry is the read-only, root-owned tar entry of one walked path.
func treeEntry(p, name string, d fs.DirEntry) (entry, error) {
	switch {
	case d.Type()&fs.ModeSymlink != 0:
		target, err := os.Readlink(p)
		return entry{hdr: &tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}, err
	case d.IsDir():
		return entry{hdr: &tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o555}}, nil
	case d.Type().IsRegular():
		info, err := d.Info()
		if err != nil {
			return entry{}, err
		}
		mode := int64(0o444)
		if info.Mode()&0o111 != 0 {
			mode = 0o555
		}
		return entry{hdr: &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode}, src: p}, nil
	}
	return entry{}, fmt.Errorf("a %v: only directories, regular files and symlinks go into an image", d.Type())
}
