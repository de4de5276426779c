package claims

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Find checks that ref names an existing test under the repository root:
// a `func Func(` in one of the package directory's _test.go files and, for
// a subtest, each of its names written in those files (as a string, with
// the spaces `go test` turns into underscores).
func Find(root string, ref TestRef) error {
	src, err := testSources(filepath.Join(root, filepath.FromSlash(ref.Package)))
	if err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	fn := regexp.MustCompile(`(?m)^func ` + regexp.QuoteMeta(ref.Func) + `\(`)
	if !fn.MatchString(src) {
		return fmt.Errorf("%s: no func %s( in %s/*_test.go: rename the reference in docs/security.md or restore the test", ref, ref.Func, ref.Package)
	}
	if ref.Sub == "" {
		return nil
	}
	for _, name := range strings.Split(ref.Sub, "/") {
		if !strings.Contains(src, name) && !strings.Contains(src, strings.ReplaceAll(name, "_", " ")) {
			return fmt.Errorf("%s: subtest %q of %s is not named in %s/*_test.go", ref, name, ref.Func, ref.Package)
		}
	}
	return nil
}

// testSources concatenates a directory's _test.go files.
func testSources(dir string) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return "", err
	}
	if len(files) == 0 {
		return "", fmt.Errorf("no _test.go files in %s (a package directory from the repository root, e.g. server or test/talos)", dir)
	}
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		b.Write(data)
		b.WriteByte('\n')
	}
	return b.String(), nil
}
