package talos

import (
	"bufio"
	"os"
	"strings"
	"testing"
)

// unitFile is a parsed systemd unit: "Section.Key" → values in order
// (systemd.syntax(7); an empty assignment resets a list, kept as "").
type unitFile map[string][]string

func parseUnit(t *testing.T, path string) unitFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unitFile{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";"):
		case strings.HasPrefix(l, "[") && strings.HasSuffix(l, "]"):
			section = l[1 : len(l)-1]
		default:
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				t.Fatalf("%s: not a key=value line: %q", path, l)
			}
			u[section+"."+strings.TrimSpace(k)] = append(u[section+"."+strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

// one returns the single value of key, failing when it is not set once.
func (u unitFile) one(t *testing.T, key string) string {
	t.Helper()
	if len(u[key]) != 1 {
		t.Fatalf("unit: want exactly one %s, got %q", key, u[key])
	}
	return u[key][0]
}

// words splits a value into words as systemd does, honouring double and
// single quotes (systemd.syntax(7), "Quoting").
func words(s string) []string {
	var out []string
	var cur strings.Builder
	var quote rune
	inWord := false
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				out, inWord = append(out, cur.String()), false
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out
}

// environment is what systemd passes to ExecStart: Environment= entries,
// then EnvironmentFile= ones overriding them (systemd.exec(5)). files maps
// an EnvironmentFile path to the file the test wrote for it.
func (u unitFile) environment(t *testing.T, files map[string]string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, v := range u["Service.Environment"] {
		for _, w := range words(v) {
			k, val, _ := strings.Cut(w, "=")
			env[k] = val
		}
	}
	for _, v := range u["Service.EnvironmentFile"] {
		optional := strings.HasPrefix(v, "-")
		path := strings.TrimPrefix(v, "-")
		host, ok := files[path]
		if !ok {
			if !optional {
				t.Fatalf("unit needs EnvironmentFile %s", path)
			}
			continue
		}
		b, err := os.ReadFile(host)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				k, val, _ := strings.Cut(l, "=")
				env[k] = strings.Trim(val, `"'`)
			}
		}
	}
	return env
}
