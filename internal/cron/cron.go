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
// The descriptors @yearly (@annually), @monthly, @weekly, @daily
// (@midnight), @noon and @hourly stand for their 5-field expressions, as
// in Vixie cron and Fugit (GitLab's pipeline schedules).
//
// Match answers "does this minute match" (a policy period); Next finds the
// next matching minute in a time zone (a pipeline schedule).
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

// descriptors are the @names of whole expressions.
var descriptors = map[string]string{
	"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
	"@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@noon": "0 12 * * *", "@hourly": "0 * * * *",
}

// Parse parses a 5-field expression or a descriptor.
func Parse(expr string) (Schedule, error) {
	parts := strings.Fields(expr)
	if len(parts) == 1 && strings.HasPrefix(parts[0], "@") {
		full, ok := descriptors[strings.ToLower(parts[0])]
		if !ok {
			return Schedule{}, fmt.Errorf("%w: %q: unknown descriptor (want @yearly, @annually, @monthly, @weekly, @daily, @midnight, @noon or @hourly)", ErrSyntax, expr)
		}
		s, err := Parse(full)
		s.expr = strings.ToLower(parts[0])
		return s, err
	}
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
	return s.dayMatch(t)
}

// horizon bounds Next's search: every expression that can match at all
// matches within 8 years (29 February skips at most 2100, 2200, 2300).
const horizon = 9 * 366 * 24 * time.Hour

// Next returns the first minute after t that matches, as wall-clock time
// in loc, or the zero time if none does within nine years (an expression
// such as "0 0 30 2 *" never matches). The result is in loc.
//
// Daylight saving time: a wall-clock minute that a clock change skips
// (02:30 on the night the clocks go forward) does not happen, so it does
// not match; a minute that happens twice (01:30 on the night they go
// back) matches once, the first time.
func (s Schedule) Next(t time.Time, loc *time.Location) time.Time {
	if s.minute == 0 {
		return time.Time{} // the zero Schedule
	}
	t = t.In(loc)
	// The next whole minute strictly after t.
	t = t.Add(time.Minute - time.Duration(t.Second())*time.Second - time.Duration(t.Nanosecond()))
	end := t.Add(horizon)
	for t.Before(end) {
		y, mo, d := t.Date()
		var next time.Time
		switch {
		case s.month&(1<<uint(mo)) == 0:
			next = time.Date(y, mo+1, 1, 0, 0, 0, 0, loc)
		case !s.dayMatch(t):
			next = time.Date(y, mo, d+1, 0, 0, 0, 0, loc)
		case s.hour&(1<<uint(t.Hour())) == 0:
			// To the next hour of the wall clock, in absolute time:
			// time.Date could land in a skipped hour.
			next = t.Add(time.Duration(60-t.Minute()) * time.Minute)
		case s.minute&(1<<uint(t.Minute())) == 0:
			next = t.Add(time.Minute)
		case repeated(t):
			next = t.Add(time.Minute)
		default:
			return t
		}
		if !next.After(t) {
			// time.Date normalised a midnight that a clock change skips
			// to before t: step instead.
			next = t.Add(time.Minute)
		}
		t = next
	}
	return time.Time{}
}

func (s Schedule) dayMatch(t time.Time) bool {
	dom := s.dom&(1<<uint(t.Day())) != 0
	dow := s.dow&(1<<uint(t.Weekday())) != 0
	if s.domStar || s.dowStar {
		return dom && dow
	}
	return dom || dow
}

// repeated reports whether t's wall-clock minute already happened at an
// earlier instant: clocks went back within the last three hours by d, and
// t − d reads the same.
func repeated(t time.Time) bool {
	_, off := t.Zone()
	_, before := t.Add(-3 * time.Hour).Zone()
	if before <= off {
		return false
	}
	e := t.Add(-time.Duration(before-off) * time.Second)
	return e.Hour() == t.Hour() && e.Minute() == t.Minute() && e.Day() == t.Day()
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
