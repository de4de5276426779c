package claims

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// repoRoot is the repository root seen from this package's directory.
const repoRoot = "../.."

// TestRegister holds docs/security.md to its tests: every test a claim
// names must exist, in whichever module it lives.
func TestRegister(t *testing.T) {
	f, err := os.Open(filepath.Join(repoRoot, "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range rows {
		for _, ref := range row.Tests {
			if err := Find(repoRoot, ref); err != nil {
				t.Errorf("docs/security.md line %d (%.60s…): %v", row.Line, row.Claim, err)
			}
		}
	}
	t.Logf("%d claims checked", len(rows))
}

func TestParse(t *testing.T) {
	tests := []struct {
		name, doc string
		want      []string // each row's test refs, joined by space
		wantErr   string
	}{
		{"one row", "| claim | attacker | tests |\n|---|---|---|\n| c | a | `server.TestReload`, `test/talos.TestImage/amd64` |\n",
			[]string{"server.TestReload test/talos.TestImage/amd64"}, ""},
		{"escaped pipe", "| claim | attacker | tests |\n|--|--|--|\n| a \\| b | a | `x.TestY` |\n", []string{"x.TestY"}, ""},
		{"other tables ignored", "| claim | attacker | tests |\n|-|-|-|\n| c | a | `x.TestY` |\n\n| what | why |\n|-|-|\n| w | y |\n", []string{"x.TestY"}, ""},
		{"no test", "| claim | attacker | tests |\n|-|-|-|\n| c | a | soon |\n", nil, "line 3: no test named"},
		{"missing cell", "| claim | attacker | tests |\n|-|-|-|\n| c | `x.TestY` |\n", nil, "2 cells"},
		{"no attacker", "| claim | attacker | tests |\n|-|-|-|\n| c |  | `x.TestY` |\n", nil, "attacker"},
		{"no table", "# nothing\n", nil, "no table"},
	}
	for _, tt := range tests {
		rows, err := Parse(strings.NewReader(tt.doc))
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: err = %v, want %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		var got []string
		for _, r := range rows {
			var refs []string
			for _, ref := range r.Tests {
				refs = append(refs, ref.String())
			}
			got = append(got, strings.Join(refs, " "))
		}
		if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
			t.Errorf("%s: rows %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestFind(t *testing.T) {
	root := t.TempDir()
	pkg := filepath.Join(root, "test", "talos")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	src := "package talos\n\nfunc TestImage(t *testing.T) {\n\tt.Run(\"file key\", nil)\n}\n\n// func TestCommented(\n"
	if err := os.WriteFile(filepath.Join(pkg, "x_test.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		ref     TestRef
		wantErr string
	}{
		{TestRef{"test/talos", "TestImage", ""}, ""},
		{TestRef{"test/talos", "TestImage", "file_key"}, ""},
		{TestRef{"test/talos", "TestIma", ""}, "no func TestIma("},
		{TestRef{"test/talos", "TestCommented", ""}, "no func TestCommented("},
		{TestRef{"test/talos", "TestImage", "pkcs11"}, `subtest "pkcs11"`},
		{TestRef{"test/deploy", "TestImage", ""}, "no _test.go files"},
	}
	for _, tt := range tests {
		err := Find(root, tt.ref)
		if (tt.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("Find(%s) = %v, want %q", tt.ref, err, tt.wantErr)
		}
	}
}
