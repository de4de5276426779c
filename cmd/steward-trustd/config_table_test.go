package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/atomicfile"
)

// The README's configuration table lies between these markers.
const (
	tableBegin = "<!-- begin configuration table: generated from cmd/steward-trustd/config.go by TestREADMEConfigTable -->\n"
	tableEnd   = "<!-- end configuration table -->\n"
)

// TestREADMEConfigTable holds README's configuration table to the
// settings table: a setting added, renamed or given a new default in the
// code fails here until README shows it. STEWARD_UPDATE_README=1
// rewrites README's table from the code.
func TestREADMEConfigTable(t *testing.T) {
	const path = "../../README.md"
	readme, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok1 := bytes.Cut(readme, []byte(tableBegin))
	got, after, ok2 := bytes.Cut(rest, []byte(tableEnd))
	if !ok1 || !ok2 {
		t.Fatalf("README.md lacks the markers %q … %q around the configuration table", tableBegin, tableEnd)
	}
	want := markdownTable((&config{}).settings())
	if string(got) == want {
		return
	}
	if os.Getenv("STEWARD_UPDATE_README") != "1" {
		t.Fatalf("README.md's configuration table differs from the settings in config.go; regenerate it:\n"+
			"  STEWARD_UPDATE_README=1 go test ./cmd/steward-trustd -run TestREADMEConfigTable\nwant:\n%s", want)
	}
	out := bytes.Join([][]byte{before, []byte(tableBegin), []byte(want), []byte(tableEnd), after}, nil)
	if err := atomicfile.Write(path, out, 0o644, true); err != nil {
		t.Fatal(err)
	}
}

// markdownTable is README's configuration table of these settings.
func markdownTable(settings []setting) string {
	var b strings.Builder
	b.WriteString("| variable | flag | default | meaning |\n|---|---|---|---|\n")
	for _, s := range settings {
		def := strings.ReplaceAll(s.derived, "<", "&lt;") // "<cert-dir>" is no HTML tag
		if s.def != "" {
			def = "`" + s.def + "`"
		}
		fmt.Fprintf(&b, "| `%s` | `--%s` | %s | %s |\n", s.env, s.flag, def, s.doc)
	}
	return b.String()
}

// TestSettingsTable checks the table's own rules: names unique, every
// variable TRUSTD_ plus the flag's name, every default accepted by its
// own parser.
func TestSettingsTable(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	c := &config{}
	for _, s := range c.settings() {
		if seen[s.flag] || seen[s.env] {
			t.Errorf("--%s / $%s: declared twice", s.flag, s.env)
		}
		seen[s.flag], seen[s.env] = true, true
		if want := "TRUSTD_" + strings.ToUpper(strings.ReplaceAll(s.flag, "-", "_")); s.env != want {
			t.Errorf("--%s: variable %s, want %s", s.flag, s.env, want)
		}
		if s.def != "" && s.derived != "" {
			t.Errorf("--%s: two defaults, %q and %q", s.flag, s.def, s.derived)
		}
		if err := s.to.set(s.def); s.def != "" && err != nil {
			t.Errorf("--%s: default %q refused: %v", s.flag, s.def, err)
		}
		if s.doc == "" || strings.Contains(s.doc, "(default") {
			t.Errorf("--%s: doc %q: give it, and its default in def or derived only", s.flag, s.doc)
		}
	}
}
