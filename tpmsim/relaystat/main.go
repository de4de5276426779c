// Command relaystat reads steward-tpm-relay's command log (--log-commands)
// and tells how busy the TPM was over a load run's steady state: the share
// of wall time the device spent in commands, the time from the end of one
// TPM2_Sign to the start of the next, and signatures per second against
// the chip's own rate. The steady state is the commands from the -skip'th
// TPM2_Sign to the -tail'th from last, so that key creation, ramp-up and
// the last stragglers do not count.
//
//	relaystat [-sign 60ms] [-skip 50] [-tail 10] < relay.log
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, in io.Reader, out, errOut io.Writer) int {
	fs := flag.NewFlagSet("relaystat", flag.ContinueOnError)
	fs.SetOutput(errOut)
	sign := fs.Duration("sign", 60*time.Millisecond, "the relay's TPM2_Sign latency (--latency Sign=...): the chip's rate is its inverse")
	skip := fs.Int("skip", 50, "TPM2_Sign commands at the start that are not steady state")
	tail := fs.Int("tail", 10, "TPM2_Sign commands at the end that are not steady state")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cmds, err := parse(in)
	if err != nil {
		fmt.Fprintln(errOut, "relaystat:", err)
		return 1
	}
	s, err := summarize(cmds, *skip, *tail)
	if err != nil {
		fmt.Fprintln(errOut, "relaystat:", err, "(run the relay with --log-commands and the load long enough)")
		return 1
	}
	fmt.Fprintln(out, s.String(*sign))
	return 0
}

// command is one logged TPM command: its name, start and duration.
type command struct {
	name  string
	start time.Time
	took  time.Duration
}

func (c command) end() time.Time { return c.start.Add(c.took) }

var line = regexp.MustCompile(`command=(\S+) response_code=\S+ took=(\S+) start_us=(\d+)`)

// parse reads the relay's debug lines, in start order.
func parse(in io.Reader) ([]command, error) {
	var cmds []command
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		took, err := time.ParseDuration(m[2])
		if err != nil {
			return nil, fmt.Errorf("took=%q: %w", m[2], err)
		}
		us, err := strconv.ParseInt(m[3], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("start_us=%q: %w", m[3], err)
		}
		cmds = append(cmds, command{name: m[1], start: time.UnixMicro(us), took: took})
	}
	slices.SortFunc(cmds, func(a, b command) int { return a.start.Compare(b.start) })
	return cmds, sc.Err()
}

// summary is the steady state's figures.
type summary struct {
	signatures int           // TPM2_Sign commands that ended in the window after its first
	span, busy time.Duration // wall time of the window, and time in commands
	gaps       []time.Duration
}

// summarize measures the window from the skip'th TPM2_Sign to the
// tail'th from last.
func summarize(cmds []command, skip, tail int) (summary, error) {
	var signs []int
	for i, c := range cmds {
		if c.name == "Sign" {
			signs = append(signs, i)
		}
	}
	if skip < 0 || tail < 0 || len(signs) < skip+tail+2 {
		return summary{}, errors.New("too few TPM2_Sign commands in the log for the window")
	}
	win := cmds[signs[skip] : signs[len(signs)-1-tail]+1]
	s := summary{span: win[len(win)-1].end().Sub(win[0].start)}
	var lastSign *command
	for i := range win {
		s.busy += win[i].took
		if win[i].name != "Sign" {
			continue
		}
		if lastSign != nil {
			s.gaps = append(s.gaps, win[i].start.Sub(lastSign.end()))
			s.signatures++
		}
		lastSign = &win[i]
	}
	slices.Sort(s.gaps)
	return s, nil
}

// String reports the summary against a chip whose TPM2_Sign takes sign.
func (s summary) String(sign time.Duration) string {
	var total time.Duration
	for _, g := range s.gaps {
		total += g
	}
	rate := float64(s.signatures) / s.span.Seconds()
	return fmt.Sprintf("%d signatures in %.2fs = %.2f/s = %.3f of the chip's %.1f/s; device busy %.3f of the time; "+
		"end of one TPM2_Sign to the start of the next: mean %v, p50 %v, p90 %v, max %v",
		s.signatures, s.span.Seconds(), rate, rate*sign.Seconds(), 1/sign.Seconds(), float64(s.busy)/float64(s.span),
		(total / time.Duration(len(s.gaps))).Round(10*time.Microsecond), s.quantile(0.5), s.quantile(0.9), s.quantile(1))
}

func (s summary) quantile(q float64) time.Duration {
	i := min(int(q*float64(len(s.gaps))), len(s.gaps)-1)
	return s.gaps[i].Round(10 * time.Microsecond)
}
