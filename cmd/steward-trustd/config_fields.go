package main

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/steward-trustd/steward-trustd/cmd/internal/cli"
	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// field is a setting's typed destination in config.
type field interface {
	// kind names the value's type in --help ("int", "duration", …).
	kind() string
	// set parses text into the field. Its error says what is wrong
	// without naming the setting, which the caller adds.
	set(text string) error
}

// parser turns a setting's text into a value.
type parser[T any] func(text string) (T, error)

// typedField is a field of type T with its parser.
type typedField[T any] struct {
	name  string
	dst   *T
	parse parser[T]
}

func (f typedField[T]) kind() string { return f.name }

func (f typedField[T]) set(text string) error {
	v, err := f.parse(text)
	if err != nil {
		return err
	}
	*f.dst = v
	return nil
}

// bind is a field of config named kind in --help, filled by parse.
func bind[T any](kind string, dst *T, parse parser[T]) field {
	return typedField[T]{name: kind, dst: dst, parse: parse}
}

func text(dst *string) field             { return bind("string", dst, asText) }
func list(dst *[]string) field           { return bind("strings", dst, asList) }
func boolean(dst *bool) field            { return bind("bool", dst, asBool) }
func posInt(dst *int) field              { return bind("int", dst, intIn(1, 1<<31-1)) }
func rate(dst *float64) field            { return bind("float", dst, asRate) }
func duration(dst *time.Duration) field  { return bind("duration", dst, asDuration) }
func base64Bytes(dst *[]byte) field      { return bind("base64", dst, asBase64) }
func asText(v string) (string, error)    { return v, nil }
func asList(v string) ([]string, error)  { return cli.SplitList(v), nil }
func tokenList(v string) ([]byte, error) { return []byte(strings.Join(cli.SplitList(v), "\n")), nil }

// notOne says a value is not what the setting takes.
func notOne(v, what string) error { return fmt.Errorf("%q is not %s", v, what) }

func tcpPort(v string) (int, error) {
	p, err := strconv.Atoi(v)
	if err != nil || p < 1 || p > 65535 {
		return 0, notOne(v, "a TCP port")
	}
	return p, nil
}

func ipAddress(v string) (string, error) {
	a, err := netip.ParseAddr(v)
	if err != nil {
		return "", notOne(v, "an IP address")
	}
	return a.String(), nil
}

// absPath refuses a relative cert dir: the reloader re-reads files by
// name for as long as the daemon runs, and a relative path would follow
// whatever working directory the service manager chose.
func absPath(v string) (string, error) {
	if !filepath.IsAbs(v) {
		return "", fmt.Errorf("%q is a relative path: give the absolute path, e.g. /etc/steward-trustd/certs or \"$PWD/%s\"", v, filepath.Clean(v))
	}
	return filepath.Clean(v), nil
}

func asBool(v string) (bool, error) {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, notOne(v, "true or false")
	}
	return b, nil
}

// intIn reads an integer in lo..hi.
func intIn(lo, hi int) parser[int] {
	return func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		switch {
		case err != nil || n < 1:
			return 0, notOne(v, "a positive integer")
		case n < lo || n > hi:
			return 0, fmt.Errorf("%d is outside %d..%d", n, lo, hi)
		}
		return n, nil
	}
}

// asRate reads a positive rate, or -1 for no limit.
func asRate(v string) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || (f <= 0 && f != -1) {
		return 0, notOne(v, "a positive number or -1")
	}
	return f, nil
}

func asDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d < 100*time.Millisecond {
		return 0, notOne(v, "a duration of at least 100ms")
	}
	return d, nil
}

// deferAccept reads TRUSTD_DEFER_ACCEPT: whole seconds (the kernel's
// unit) from 1s to 1m, or "off" (-1).
func deferAccept(v string) (time.Duration, error) {
	if v == "off" {
		return -1, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Second || d > time.Minute {
		return 0, notOne(v, "a duration of 1s to 1m, or off")
	}
	return d, nil
}

// asBase64 decodes a base64 setting. Its value is never echoed: some of
// these settings are keys.
func asBase64(v string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
	if err != nil {
		return nil, errors.New("value is not valid base64")
	}
	return b, nil
}

func cidrList(v string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range cli.SplitList(v) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, notOne(s, "a CIDR")
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// prefixLengths reads comma-separated prefix lengths in 1..bits-1.
func prefixLengths(bits int) parser[[]int] {
	return func(v string) ([]int, error) {
		out := []int{}
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || n >= bits {
				return nil, fmt.Errorf("%q is not a comma-separated list of prefix lengths below %d", v, bits)
			}
			out = append(out, n)
		}
		return out, nil
	}
}

// fingerprintList reads TRUSTD_ROOT_SHA256: hex SHA-256 fingerprints (as
// `openssl x509 -in os-ca.crt -outform der | sha256sum` prints them,
// colons allowed), lower-cased.
func fingerprintList(v string) ([]string, error) {
	var pins []string
	for _, p := range cli.SplitList(v) {
		fp, err := pki.ParseFingerprint(p)
		if err != nil {
			return nil, err
		}
		pins = append(pins, fp)
	}
	return pins, nil
}
