// Package cron matches times against 5-field cron expressions, the form of
// the periods of an autoscaler policy ([[runners.autoscaler.policy]]
// periods = ["* 8-18 * * mon-fri"]).
//
// An expression is "minute hour day-of-month month day-of-week". Each field
// is "*", a value, a range "a-b", a list "a,b-c", any of those with a step
// "/n" ("*/15", "8-18/2"), and for months and weekdays the English
// three-letter names ("jan", "mon", case-insensitive). Day-of-week 0 and 7
// are Sunday. As in Vixie cron, when both day-of-month and day-of-week are
// restricted (neither starts with "*"), a day matches if either matches.
//
// A Schedule only answers "does this minute match"; it never computes the
// next run. That is all a policy period needs, and it keeps the matcher
// small enough to read in one sitting.
package cron

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Schedule is a parsed expression. The zero value matches nothing; use
// Parse.
type Schedule struct {
	minute, hour, dom, month, dow uint64 // bit i set: value i matches
	domStar, dowStar              bool
	expr                          string
}

// ErrSyntax is wrapped by every parse error.
var ErrSyntax = errors.New("cron syntax")

type field struct {
	name     string
	min, max int
	names    []string // names[i] is value min+i
}

var fields = [5]field{
	{name: "minute", min: 0, max: 59},
	{name: "hour", min: 0, max: 23},
	{name: "day-of-month", min: 1, max: 31},
	{name: "month", min: 1, max: 12, names: []string{"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"}},
	{name: "day-of-week", min: 0, max: 7, names: []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}},
}

// Parse parses a 5-field expression.
func Parse(expr string) (Schedule, error) {
	parts := strings.Fields(expr)
	if len(parts) != 5 {
		return Schedule{}, fmt.Errorf("%w: %q: want 5 fields (minute hour day-of-month month day-of-week), got %d", ErrSyntax, expr, len(parts))
	}
	var bits [5]uint64
	for i, p := range parts {
		b, err := fields[i].parse(p)
		if err != nil {
			return Schedule{}, fmt.Errorf("%w: %q: %s: %v", ErrSyntax, expr, fields[i].name, err)
		}
		bits[i] = b
	}
	// Sunday is 0 and 7.
	if bits[4]&(1<<7) != 0 {
		bits[4] |= 1
	}
	return Schedule{
		minute: bits[0], hour: bits[1], dom: bits[2], month: bits[3], dow: bits[4],
		domStar: strings.HasPrefix(parts[2], "*"),
		dowStar: strings.HasPrefix(parts[4], "*"),
		expr:    strings.Join(parts, " "),
	}, nil
}

// MustParse is Parse for expressions known to be valid; it panics otherwise.
func MustParse(expr string) Schedule {
	s, err := Parse(expr)
	if err != nil {
		panic(err)
	}
	return s
}

// String returns the expression, fields separated by single spaces.
func (s Schedule) String() string { return s.expr }

// Match reports whether the minute containing t matches, in t's location.
func (s Schedule) Match(t time.Time) bool {
	if s.minute&(1<<uint(t.Minute())) == 0 || s.hour&(1<<uint(t.Hour())) == 0 || s.month&(1<<uint(t.Month())) == 0 {
		return false
	}
	dom := s.dom&(1<<uint(t.Day())) != 0
	dow := s.dow&(1<<uint(t.Weekday())) != 0
	if s.domStar || s.dowStar {
		return dom && dow
	}
	return dom || dow
}

func (f field) parse(s string) (uint64, error) {
	var bits uint64
	for _, item := range strings.Split(s, ",") {
		b, err := f.parseItem(item)
		if err != nil {
			return 0, err
		}
		bits |= b
	}
	return bits, nil
}

func (f field) parseItem(item string) (uint64, error) {
	rng, stepStr, hasStep := strings.Cut(item, "/")
	step := 1
	if hasStep {
		n, err := strconv.Atoi(stepStr)
		if err != nil || n <= 0 || n > f.max {
			return 0, fmt.Errorf("bad step %q", stepStr)
		}
		step = n
	}
	var lo, hi int
	switch {
	case rng == "*":
		lo, hi = f.min, f.max
		if f.name == "day-of-week" {
			hi = 6 // 7 is Sunday again
		}
	case strings.Contains(rng, "-"):
		a, b, _ := strings.Cut(rng, "-")
		var err error
		if lo, err = f.value(a); err != nil {
			return 0, err
		}
		if hi, err = f.value(b); err != nil {
			return 0, err
		}
		if lo > hi {
			return 0, fmt.Errorf("range %q runs backwards", rng)
		}
	default:
		v, err := f.value(rng)
		if err != nil {
			return 0, err
		}
		lo, hi = v, v
		if hasStep {
			hi = f.max // "5/15" means 5-max/15, as in Vixie cron
		}
	}
	var bits uint64
	for v := lo; v <= hi; v += step {
		bits |= 1 << uint(v)
	}
	return bits, nil
}

func (f field) value(s string) (int, error) {
	if s == "" {
		return 0, errors.New("empty value")
	}
	for i, n := range f.names {
		if strings.EqualFold(s, n) {
			return f.min + i, nil
		}
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < f.min || v > f.max {
		return 0, fmt.Errorf("value %q outside %d-%d", s, f.min, f.max)
	}
	return v, nil
}
