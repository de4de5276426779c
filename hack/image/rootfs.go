package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"time"
)

// nonroot is the image's user, as in distroless: uid/gid 65532.
const nonroot = 65532

// etcFiles are the only configuration files: user and group names for
// uid 65532 (Go's os/user and the C library look them up) and a resolver
// order for the C library.
var etcFiles = map[string]string{
	"/etc/passwd":        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
	"/etc/group":         "root:x:0:\nnonroot:x:65532:\n",
	"/etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
}

// dirs are created empty: /tmp for modules that write there, the
// mount points the deployments use, and the user's home.
var dirs = []struct {
	path string
	mode int64
	uid  int
}{
	{"/tmp", 0o1777, 0},
	{"/etc/steward-trustd", 0o755, 0},
	{"/opt/hsm", 0o755, 0},
	{"/home/nonroot", 0o700, nonroot},
}

// rootfsTar writes the image's single layer: files (binaries and
// libraries), etcFiles and dirs, every parent directory, all owned by
// root but the home, with mtime at created, sorted so that the same
// inputs give the same bytes.
func rootfsTar(files []file, created time.Time) ([]byte, error) {
	entries, err := entriesFor(files, created)
	if err != nil {
		return nil, err
	}
	return tarOf(entries)
}

// tarOf is the tar archive of entries, in order.
func tarOf(entries []entry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		if err := writeEntry(tw, e); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// entry is one tar header and, for regular files, where its content is.
type entry struct {
	hdr  *tar.Header
	src  string
	data []byte
}

func entriesFor(files []file, created time.Time) ([]entry, error) {
	byPath := map[string]entry{}
	add := func(e entry) error {
		if _, dup := byPath[e.hdr.Name]; dup {
			return fmt.Errorf("%s twice in the image", e.hdr.Name)
		}
		e.hdr.ModTime, e.hdr.Format = created, tar.FormatPAX
		byPath[e.hdr.Name] = e
		addParents(byPath, e.hdr.Name, created)
		return nil
	}
	for _, f := range files {
		if err := add(fileEntry(f)); err != nil {
			return nil, err
		}
	}
	for p, content := range etcFiles {
		if err := add(entry{hdr: &tar.Header{Typeflag: tar.TypeReg, Name: rel(p), Mode: 0o644, Size: int64(len(content))}, data: []byte(content)}); err != nil {
			return nil, err
		}
	}
	for _, d := range dirs {
		if err := add(entry{hdr: &tar.Header{Typeflag: tar.TypeDir, Name: rel(d.path) + "/", Mode: d.mode, Uid: d.uid, Gid: d.uid}}); err != nil {
			return nil, err
		}
	}
	out := make([]entry, 0, len(byPath))
	for _, e := range byPath {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].hdr.Name < out[j].hdr.Name })
	return out, nil
}

func fileEntry(f file) entry {
	if f.link != "" {
		return entry{hdr: &tar.Header{Typeflag: tar.TypeSymlink, Name: rel(f.dst), Linkname: f.link, Mode: 0o777}}
	}
	return entry{hdr: &tar.Header{Typeflag: tar.TypeReg, Name: rel(f.dst), Mode: f.mode}, src: f.src}
}

// addParents adds a 0755 root directory entry for each missing parent.
func addParents(byPath map[string]entry, name string, created time.Time) {
	for d := path.Dir(trimSlash(name)); d != "." && d != "/"; d = path.Dir(d) {
		if _, ok := byPath[d+"/"]; ok {
			continue
		}
		byPath[d+"/"] = entry{hdr: &tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: created, Format: tar.FormatPAX}}
	}
}

func trimSlash(s string) string {
	for len(s) > 1 && s[len(s)-1] == '/' {
		s = s[:len(s)-1]
	}
	return s
}

// rel is the tar name of an absolute image path.
func rel(p string) string { return path.Clean(p)[1:] }

// writeEntry writes e, reading a regular file's content from e.src
// (following symlinks: Debian's libraries are symlinks to versioned files).
func writeEntry(tw *tar.Writer, e entry) error {
	if e.src != "" {
		b, err := os.ReadFile(e.src)
		if err != nil {
			return err
		}
		e.data = b
		e.hdr.Size = int64(len(b))
	}
	if err := tw.WriteHeader(e.hdr); err != nil {
		return fmt.Errorf("tar %s: %w", e.hdr.Name, err)
	}
	if _, err := io.Copy(tw, bytes.NewReader(e.data)); err != nil {
		return fmt.Errorf("tar %s: %w", e.hdr.Name, err)
	}
	return nil
}
