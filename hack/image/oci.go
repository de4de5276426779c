package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// binaries are the commands the image ships; the first is the entrypoint.
var binaries = []string{"steward-trustd", "steward-trustd-ceremony", "steward-trustd-gencreds", "steward-trustd-authorizer"}

// moduleRuntime is what PKCS#11 modules written in C++ (SoftHSM, most
// vendor clients) need beyond glibc. Anything else a module needs (e.g.
// OpenSSL) comes with the module, in its own volume.
var moduleRuntime = []string{"libstdc++.so.6", "libgcc_s.so.1", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"}

type spec struct {
	out     string
	tag     string
	bins    platformBins
	created time.Time
}

// build writes the multi-platform image as an OCI layout in s.out and
// prints each platform's size.
func build(s spec, report io.Writer) error {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, b := range s.bins {
		img, err := platformImage(s, b)
		if err != nil {
			return fmt.Errorf("%s/%s: %w", b.os, b.arch, err)
		}
		if err := reportSize(report, b, img); err != nil {
			return err
		}
		a := arches[b.arch]
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: b.os, Architecture: b.arch, Variant: a.variant},
		}})
	}
	return writeLayout(s.out, s.tag, idx)
}

// platformImage is one platform's image: one layer, nonroot user.
func platformImage(s spec, b platformBin) (v1.Image, error) {
	a := arches[b.arch]
	var files, roots []string
	for _, name := range binaries {
		roots = append(roots, filepath.Join(b.dir, name))
	}
	files = append(files, roots...)
	libs, err := a.closure(roots, moduleRuntime)
	if err != nil {
		return nil, err
	}
	all := make([]file, 0, len(libs)+len(files))
	for _, p := range files {
		all = append(all, file{src: p, dst: "/usr/local/bin/" + filepath.Base(p), mode: 0o755})
	}
	layerTar, err := rootfsTar(append(all, libs...), s.created)
	if err != nil {
		return nil, err
	}
	return oneLayerImage(layerTar, func(diffIDs []v1.Hash) *v1.ConfigFile { return configFile(s, b, a, diffIDs) })
}

// oneLayerImage is an OCI image of the uncompressed layer layerTar whose
// configuration config makes from the layer's diff_ids.
func oneLayerImage(layerTar []byte, config func(diffIDs []v1.Hash) *v1.ConfigFile) (v1.Image, error) {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	if img, err = mutate.AppendLayers(img, layer); err != nil {
		return nil, err
	}
	// AppendLayers recorded the layer's diff_id in the config; the config
	// written below replaces that one, so carry the diff_ids over: a
	// runtime checks the unpacked layers against them (OCI image-spec,
	// config.md "rootfs") and containerd refuses an image without them.
	appended, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	return mutate.ConfigFile(img, config(appended.RootFS.DiffIDs))
}

// configFile is the image's configuration for the layers whose
// uncompressed digests are diffIDs, in order.
func configFile(s spec, b platformBin, a arch, diffIDs []v1.Hash) *v1.ConfigFile {
	return &v1.ConfigFile{
		Architecture: b.arch,
		OS:           b.os,
		Variant:      a.variant,
		Created:      v1.Time{Time: s.created},
		RootFS:       v1.RootFS{Type: "layers", DiffIDs: diffIDs},
		Config: v1.Config{
			User:         fmt.Sprintf("%d:%d", nonroot, nonroot),
			Entrypoint:   []string{"/usr/local/bin/" + binaries[0]},
			Env:          []string{"PATH=/usr/local/bin"},
			WorkingDir:   "/",
			ExposedPorts: map[string]struct{}{"50001/tcp": {}, "50002/tcp": {}},
			Labels: map[string]string{
				"org.opencontainers.image.title":   "steward-trustd",
				"org.opencontainers.image.version": s.tag,
			},
		},
	}
}

// writeLayout replaces dir with an OCI layout holding idx under tag.
func writeLayout(dir, tag string, idx v1.ImageIndex) error {
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag})); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// reportSize prints the compressed (what a registry stores and a node
// pulls) and uncompressed size of one platform's image.
func reportSize(w io.Writer, b platformBin, img v1.Image) error {
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	var compressed, uncompressed int64
	for _, l := range layers {
		c, err := l.Size()
		if err != nil {
			return err
		}
		rc, err := l.Uncompressed()
		if err != nil {
			return err
		}
		u, err := io.Copy(io.Discard, rc)
		err = errors.Join(err, rc.Close())
		if err != nil {
			return err
		}
		compressed, uncompressed = compressed+c, uncompressed+u
	}
	_, err = fmt.Fprintf(w, "image %s/%s: %.1f MB compressed, %.1f MB uncompressed\n", b.os, b.arch, float64(compressed)/1e6, float64(uncompressed)/1e6)
	return err
}
