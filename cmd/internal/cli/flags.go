package cli

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// Validity bounds of the --hours flags. A CA outliving 20 years, or a
// certificate it issues outliving 10, is a mistake rather than a policy;
// the bounds also keep hours×time.Hour far from int64 overflow (2562047
// hours), where a larger value used to wrap silently.
const (
	// MaxCAHours bounds the validity of a CA certificate: 20 years.
	MaxCAHours = 20 * 365 * 24
	// MaxLeafHours bounds the validity of a client or serving
	// certificate: 10 years.
	MaxLeafHours = 10 * 365 * 24
)

// SplitList flattens repeated and comma-separated values ("a,b", " c ")
// into one list, trimming spaces and dropping empty items.
func SplitList(vals ...string) []string {
	var out []string
	for _, v := range vals {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

// listValue is a repeatable, comma-separated list flag. The first use
// replaces the default; later uses append.
type listValue struct {
	p   *[]string
	set bool
}

func (v *listValue) Set(s string) error {
	if !v.set {
		*v.p, v.set = nil, true
	}
	*v.p = append(*v.p, SplitList(s)...)
	return nil
}

func (v *listValue) String() string { return strings.Join(*v.p, ",") }
func (v *listValue) Type() string   { return "list" }

// ListVar defines a list flag (repeat it or comma-separate its values)
// with default def.
func ListVar(fs *pflag.FlagSet, p *[]string, name string, def []string, usage string) {
	*p = append([]string(nil), def...)
	fs.Var(&listValue{p: p}, name, usage)
}

// boundedDuration is a duration flag refused outside [min, max] when
// parsed, so the error names the flag and the bound.
type boundedDuration struct {
	p        *time.Duration
	min, max time.Duration
	hours    bool // value is a whole number of hours
}

func (v *boundedDuration) Set(s string) error {
	d, err := v.parse(s)
	if err != nil {
		return err
	}
	if d < v.min || d > v.max {
		return fmt.Errorf("must be %s to %s", v.format(v.min), v.format(v.max))
	}
	*v.p = d
	return nil
}

func (v *boundedDuration) parse(s string) (time.Duration, error) {
	if !v.hours {
		return time.ParseDuration(s)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a whole number of hours", s)
	}
	// Compare in hours first: n*time.Hour overflows past 2562047.
	if n < int64(v.min/time.Hour) || n > int64(v.max/time.Hour) {
		return 0, fmt.Errorf("must be %s to %s", v.format(v.min), v.format(v.max))
	}
	return time.Duration(n) * time.Hour, nil
}

func (v *boundedDuration) format(d time.Duration) string {
	if !v.hours {
		return d.String()
	}
	h := int64(d / time.Hour)
	if y := h / (365 * 24); y > 0 && h%(365*24) == 0 {
		return fmt.Sprintf("%d hours (%d years)", h, y)
	}
	return fmt.Sprintf("%d", h)
}

func (v *boundedDuration) String() string {
	if v.hours {
		return strconv.FormatInt(int64(*v.p/time.Hour), 10)
	}
	return v.p.String()
}

func (v *boundedDuration) Type() string {
	if v.hours {
		return "hours"
	}
	return "duration"
}

// HoursVar defines a validity flag: a whole number of hours from 1 to
// maxHours, default defHours, stored as a duration. The bound is appended
// to the usage text.
func HoursVar(fs *pflag.FlagSet, p *time.Duration, name string, defHours, maxHours int, usage string) {
	*p = time.Duration(defHours) * time.Hour
	v := &boundedDuration{p: p, min: time.Hour, max: time.Duration(maxHours) * time.Hour, hours: true}
	fs.Var(v, name, fmt.Sprintf("%s, %s to %s", usage, v.format(v.min), v.format(v.max)))
}

// DurationVar defines a duration flag (e.g. 10s) bounded to [min, max],
// default def. The bound is appended to the usage text.
func DurationVar(fs *pflag.FlagSet, p *time.Duration, name string, def, min, max time.Duration, usage string) {
	*p = def
	fs.Var(&boundedDuration{p: p, min: min, max: max}, name, fmt.Sprintf("%s, %s to %s", usage, min, max))
}

// pcrsValue is a PCR selection flag parsed by the TPM backend's grammar.
type pcrsValue struct{ p *[]int }

func (v *pcrsValue) Set(s string) error {
	// Spaces around items ("7, 11") were always accepted on the command
	// line; the URI grammar has none.
	items := strings.Split(s, ",")
	for i := range items {
		items[i] = strings.TrimSpace(items[i])
	}
	pcrs, err := ParsePCRs(strings.Join(items, ","))
	if err != nil {
		return err
	}
	*v.p = pcrs
	return nil
}

func (v *pcrsValue) String() string {
	s := make([]string, len(*v.p))
	for i, p := range *v.p {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

func (v *pcrsValue) Type() string { return "pcrs" }

// PCRsVar defines a TPM PCR selection flag ("7,11"); nil when not given.
func PCRsVar(fs *pflag.FlagSet, p *[]int, name, usage string) {
	fs.Var(&pcrsValue{p: p}, name, usage)
}

// ParsePCRs parses a PCR list with the TPM backend's own rule, the same
// one its key URIs' pcrs= attribute uses (sorted, 0-23, no duplicates).
// It is the only place the command line parses PCRs.
func ParsePCRs(s string) ([]int, error) {
	return tpmpolicy.ParsePCRs(s)
}

// Required returns a usage error naming, in order, every flag whose value
// is empty.
func Required(flags map[string]string) error {
	var missing []string
	for name, v := range flags {
		if v == "" {
			missing = append(missing, "--"+name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	sort.Strings(missing)
	return Usagef("required flag(s) %s not set", strings.Join(missing, ", "))
}
