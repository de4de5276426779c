// Package claims reads the claims register (docs/security.md): one table
// row per security or compatibility claim the README makes, with the
// attacker it assumes and the Go tests that prove it. The register's own
// test checks every named test exists, so a renamed or deleted test cannot
// leave a claim standing on nothing.
package claims

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// Row is one claim of the register.
type Row struct {
	// Line is the row's line number in the register, for error messages.
	Line int
	// Claim is what the README promises.
	Claim string
	// Attacker is who the claim holds against.
	Attacker string
	// Tests are the tests that prove it.
	Tests []TestRef
}

// TestRef names one Go test: Package is the directory from the repository
// root (any module: the root module, test/talos, test/deploy), Func the
// top-level test or fuzz function, Sub the subtest path (may be empty).
type TestRef struct {
	Package, Func, Sub string
}

// String gives the reference as written in the register.
func (r TestRef) String() string {
	s := r.Package + "." + r.Func
	if r.Sub != "" {
		s += "/" + r.Sub
	}
	return s
}

// header is the first cell of the register table's header row; rows of any
// other table (e.g. the claims without a test yet) are not claims with tests.
const header = "claim"

// refPattern is `pkg/path.TestName` or `pkg/path.TestName/subtest`.
var refPattern = regexp.MustCompile("`([a-z0-9_/-]+)\\.((?:Test|Fuzz)[A-Za-z0-9_]*)(?:/([^`]+))?`")

// Parse reads the register's claims table: the markdown table whose header
// starts with "| claim |", one row per line. A row without a test reference
// is an error: claims without a test belong in their own section.
func Parse(r io.Reader) ([]Row, error) {
	var rows []Row
	in := false
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		cells, ok := splitRow(sc.Text())
		switch {
		case !ok:
			in = false
		case strings.EqualFold(cells[0], header):
			in = true
		case in && !isRule(cells):
			row, err := parseRow(n, cells)
			if err != nil {
				return nil, err
			}
			rows = append(rows, row)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read the claims register: %w", err)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("the claims register has no table with a %q header", "| claim | attacker | tests |")
	}
	return rows, nil
}

// parseRow reads the cells claim | attacker | tests.
func parseRow(n int, cells []string) (Row, error) {
	if len(cells) != 3 {
		return Row{}, fmt.Errorf("line %d: %d cells, want 3 (claim | attacker | tests); a | inside a cell must be written \\|", n, len(cells))
	}
	row := Row{Line: n, Claim: cells[0], Attacker: cells[1]}
	for _, m := range refPattern.FindAllStringSubmatch(cells[2], -1) {
		row.Tests = append(row.Tests, TestRef{Package: m[1], Func: m[2], Sub: m[3]})
	}
	switch {
	case row.Claim == "" || row.Attacker == "":
		return Row{}, fmt.Errorf("line %d: the claim and the attacker must both be given", n)
	case len(row.Tests) == 0:
		return Row{}, fmt.Errorf("line %d: no test named as `pkg/path.TestName`: a claim without a test goes under \"Claims without a test yet\"", n)
	}
	return row, nil
}

// splitRow splits a markdown table line into trimmed cells; escaped pipes
// (\|) stay inside their cell.
func splitRow(line string) ([]string, bool) {
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, "|") || !strings.HasSuffix(line, "|") || len(line) < 2 {
		return nil, false
	}
	line = strings.ReplaceAll(line[1:len(line)-1], `\|`, "\x00")
	cells := strings.Split(line, "|")
	for i, c := range cells {
		cells[i] = strings.TrimSpace(strings.ReplaceAll(c, "\x00", "|"))
	}
	return cells, true
}

// isRule reports a header separator row (|---|---|).
func isRule(cells []string) bool {
	for _, c := range cells {
		if strings.Trim(c, ":- ") != "" {
			return false
		}
	}
	return true
}
