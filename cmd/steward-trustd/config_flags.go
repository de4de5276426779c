package main

import (
	"fmt"

	"github.com/spf13/pflag"
)

// configError names the setting at fault, so the daemon exits with one
// clear line.
type configError struct {
	setting setting
	msg     string
}

func (e *configError) Error() string {
	return fmt.Sprintf("invalid configuration: %s (--%s / $%s)", e.msg, e.setting.flag, e.setting.env)
}

// flagText is a setting's flag: it keeps the text as given and leaves
// parsing to loadConfig, so that a bad value is reported like a bad
// variable, and pflag never echoes one (some settings are keys). Its
// default is the table's, never the environment's: --help cannot print a
// secret given in the environment.
type flagText struct {
	text   string
	typ    string
	isBool bool
}

func (f *flagText) String() string     { return f.text }
func (f *flagText) Set(v string) error { f.text = v; return nil }
func (f *flagText) Type() string       { return f.typ }

// IsBoolFlag hides the value's type in --help: --debug alone means true.
func (f *flagText) IsBoolFlag() bool { return f.isBool }

// registerFlags adds one flag per setting. Boolean settings also work
// bare (--debug means --debug=true).
func registerFlags(fs *pflag.FlagSet) {
	for _, s := range (&config{}).settings() {
		fs.Var(&flagText{text: s.def, typ: s.to.kind(), isBool: s.to.kind() == "bool"}, s.flag, usage(s))
		if s.to.kind() == "bool" {
			fs.Lookup(s.flag).NoOptDefVal = "true"
		}
	}
}

// usage is a setting's --help line; pflag adds "(default …)" for def.
func usage(s setting) string {
	if s.derived != "" {
		return fmt.Sprintf("%s [$%s] (default %s)", s.doc, s.env, s.derived)
	}
	return fmt.Sprintf("%s [$%s]", s.doc, s.env)
}

// resolve looks a setting up by flag name: the flag if given on the
// command line, else its environment variable.
func resolve(fs *pflag.FlagSet, getenv func(string) (string, bool)) lookup {
	envOf := map[string]string{}
	for _, s := range (&config{}).settings() {
		envOf[s.flag] = s.env
	}
	return func(name string) (string, bool) {
		if f := fs.Lookup(name); f != nil && f.Changed {
			return f.Value.String(), true
		}
		return getenv(envOf[name])
	}
}
