package deploy

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var repoRoot = filepath.Join("..", "..")

// TestDockerfile: every FROM names a fully qualified image (Podman and
// Buildah refuse short names), the run stage has libstdc++ (distroless cc,
// not base), and .dockerignore keeps credentials out of the build context.
func TestDockerfile(t *testing.T) {
	var froms []string
	for _, line := range lines(t, filepath.Join(repoRoot, "Dockerfile")) {
		if f := strings.Fields(line); len(f) >= 2 && strings.EqualFold(f[0], "FROM") {
			froms = append(froms, f[1])
		}
	}
	if len(froms) != 2 {
		t.Fatalf("want a build and a run stage, got FROM %v", froms)
	}
	for _, img := range froms {
		if host, _, ok := strings.Cut(img, "/"); !ok || !strings.Contains(host, ".") {
			t.Errorf("FROM %s is not fully qualified (registry host first)", img)
		}
	}
	if run := froms[len(froms)-1]; !strings.HasPrefix(run, "gcr.io/distroless/cc-") {
		t.Errorf("run stage %s: want distroless/cc (libstdc++, libgcc_s for C++ PKCS#11 modules)", run)
	}
	ignore := lines(t, filepath.Join(repoRoot, ".dockerignore"))
	for _, want := range []string{".local/", "bin/", "**/*.key", "**/token"} {
		if !slices.Contains(ignore, want) {
			t.Errorf(".dockerignore lacks %q", want)
		}
	}
}

// lines returns the non-comment, non-empty lines of path.
func lines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
