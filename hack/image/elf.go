package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// arch is what the image needs to know about one target architecture:
// where the build machine keeps that architecture's shared libraries and
// where the image puts them (Debian's multiarch directory, which glibc's
// loader searches without an ld.so.cache).
type arch struct {
	machine elf.Machine
	// libDirs are searched in order on the build machine.
	libDirs []string
	// imageLibDir is the image directory the libraries go to.
	imageLibDir string
	// interpDir is where the build machine keeps the loader that PT_INTERP
	// names (the loader goes to exactly the PT_INTERP path in the image).
	interpDir string
	// variant is the OCI platform variant.
	variant string
}

// arches are the supported GOARCH values. arm64 libraries come from
// Debian's cross packages (libc6-arm64-cross, libstdc++6-arm64-cross,
// libgcc-s1-arm64-cross), which are the same glibc/GCC builds as the
// arm64 packages.
var arches = map[string]arch{
	"amd64": {
		machine:     elf.EM_X86_64,
		libDirs:     []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"},
		imageLibDir: "/lib/x86_64-linux-gnu",
		interpDir:   "/lib/x86_64-linux-gnu",
	},
	"arm64": {
		machine:     elf.EM_AARCH64,
		libDirs:     []string{"/usr/aarch64-linux-gnu/lib", "/usr/lib/aarch64-linux-gnu"},
		imageLibDir: "/lib/aarch64-linux-gnu",
		interpDir:   "/usr/aarch64-linux-gnu/lib",
		variant:     "v8",
	},
}

// file is one regular file of the image: its content comes from src.
// A file with link set is a symlink to link instead.
type file struct {
	src  string
	dst  string
	mode int64
	link string
}

// closure returns the loader and every shared library that roots need,
// transitively (DT_NEEDED), resolved in a.libDirs, plus the libraries
// named in extra and theirs. Each library appears once, sorted.
func (a arch) closure(roots []string, extra []string) ([]file, error) {
	c := &resolver{arch: a, seen: map[string]bool{}, interps: map[string]string{}}
	for _, r := range roots {
		if err := c.object(r); err != nil {
			return nil, err
		}
	}
	for _, name := range extra {
		if err := c.library(name); err != nil {
			return nil, err
		}
	}
	sort.Slice(c.files, func(i, j int) bool { return c.files[i].dst < c.files[j].dst })
	return c.files, nil
}

type resolver struct {
	arch
	seen map[string]bool
	// interps maps a loader's file name to its PT_INTERP path: libc names
	// the loader in DT_NEEDED too, and gets a symlink, not a second copy.
	interps map[string]string
	files   []file
}

// object adds what the ELF file at path needs: its loader and libraries.
func (c *resolver) object(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	defer func() { _ = f.Close() }() // read only
	if f.Machine != c.machine {
		return fmt.Errorf("%s is %v, want %v (built for another architecture?)", path, f.Machine, c.machine)
	}
	if err := c.interpreter(f); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for _, n := range needed {
		if err := c.library(n); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	return nil
}

// interpreter adds the PT_INTERP loader at the very path it names.
func (c *resolver) interpreter(f *elf.File) error {
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return fmt.Errorf("PT_INTERP: %w", err)
		}
		interp := string(b[:len(b)-1]) // NUL-terminated
		if !c.seen[interp] {
			c.seen[interp] = true
			c.interps[filepath.Base(interp)] = interp
			c.files = append(c.files, file{src: filepath.Join(c.interpDir, filepath.Base(interp)), dst: interp, mode: 0o755})
		}
	}
	return nil
}

// library adds the library with DT_NEEDED name soname and its own needs.
func (c *resolver) library(soname string) error {
	if c.seen[soname] {
		return nil
	}
	c.seen[soname] = true
	if interp, ok := c.interps[soname]; ok {
		c.files = append(c.files, file{dst: filepath.Join(c.imageLibDir, soname), link: interp})
		return nil
	}
	for _, d := range c.libDirs {
		p := filepath.Join(d, soname)
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			continue
		}
		c.files = append(c.files, file{src: p, dst: filepath.Join(c.imageLibDir, soname), mode: 0o755})
		return c.object(p)
	}
	return fmt.Errorf("shared library %s not found in %v (make deps installs it)", soname, c.libDirs)
}
