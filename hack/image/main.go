// Command image assembles the steward-trustd container image offline, as
// an OCI image layout, from binaries already built for each platform and
// exactly the shared libraries they need plus the C and C++ runtime that
// PKCS#11 modules need (libstdc++, libgcc_s): no base image, no shell, no
// package manager, no Docker. `make image` runs it.
//
//	go run . -out ../../bin/image -tag v1.2.3 \
//	  -bin linux/amd64=../../bin/linux-amd64 -bin linux/arm64=../../bin/linux-arm64
//
// It is a separate module so that go-containerregistry never enters the
// daemon's module graph.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// platformBins collects repeated -bin os/arch=DIR flags.
type platformBins []platformBin

type platformBin struct{ os, arch, dir string }

func (p *platformBins) String() string { return fmt.Sprint(*p) }

func (p *platformBins) Set(v string) error {
	plat, dir, ok := strings.Cut(v, "=")
	osName, archName, ok2 := strings.Cut(plat, "/")
	if !ok || !ok2 || dir == "" || osName != "linux" {
		return fmt.Errorf("want linux/ARCH=DIR, got %q", v)
	}
	if _, known := arches[archName]; !known {
		return fmt.Errorf("architecture %q: supported are amd64 and arm64", archName)
	}
	*p = append(*p, platformBin{osName, archName, dir})
	return nil
}

func run(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	out := fs.String("out", "", "OCI image layout directory to write (replaced)")
	tag := fs.String("tag", "dev", "the image's reference name in the layout (org.opencontainers.image.ref.name) and version label")
	var bins platformBins
	fs.Var(&bins, "bin", "linux/ARCH=DIR: DIR holds that platform's steward-trustd, -ceremony and -gencreds (repeatable)")
	unpackTo := fs.String("unpack", "", "instead of building: extract the linux/-arch image tagged -tag from the layout -out into this directory")
	unpackArch := fs.String("arch", "", "with -unpack or -data: the architecture (amd64, arm64)")
	data := fs.String("data", "", "instead of building steward-trustd: write to -out an image holding only this directory's files, read-only and owned by root, for a Pod's image volume (e.g. a PKCS#11 module and its libraries)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *unpackTo != "" {
		return unpack(*out, *tag, *unpackArch, *unpackTo)
	}
	created, err := sourceDate()
	if err != nil {
		return err
	}
	if *data != "" {
		if *out == "" || *unpackArch == "" {
			return fmt.Errorf("-data needs -out and -arch")
		}
		return buildData(dataSpec{dir: *data, out: *out, tag: *tag, arch: *unpackArch, created: created})
	}
	if *out == "" || len(bins) == 0 {
		return fmt.Errorf("need -out and at least one -bin")
	}
	return build(spec{out: *out, tag: *tag, bins: bins, created: created}, os.Stdout)
}

// sourceDate is $SOURCE_DATE_EPOCH (reproducible builds), else 0.
func sourceDate() (time.Time, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	s, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", v, err)
	}
	return time.Unix(s, 0).UTC(), nil
}
