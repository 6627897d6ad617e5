package ci

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

var durationUnits = map[string]time.Duration{}

func init() {
	add := func(d time.Duration, names ...string) {
		for _, n := range names {
			durationUnits[n] = d
		}
	}
	add(time.Second, "s", "sec", "secs", "second", "seconds")
	add(time.Minute, "m", "min", "mins", "minute", "minutes")
	add(time.Hour, "h", "hr", "hrs", "hour", "hours")
	add(24*time.Hour, "d", "day", "days")
	add(7*24*time.Hour, "w", "wk", "wks", "week", "weeks")
	add(30*24*time.Hour, "mo", "mos", "month", "months")
	add(365*24*time.Hour, "y", "yr", "yrs", "year", "years")
}

var (
	durationTermRe  = regexp.MustCompile(`^\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-z]*)`)
	durationClockRe = regexp.MustCompile(`^\d+(:\d+){1,3}$`)
	durationAndRe   = regexp.MustCompile(`\band\b`)
	numberHyphenRe  = regexp.MustCompile(`([a-z])-([a-z])`)
)

// ParseDuration parses a GitLab human duration ("3 hours 30 minutes",
// "1h 30m", "90", "2 days", "1 week", "1:30:00"), the syntax of GitLab's
// ChronicDuration: numbers followed by units (seconds when none), "and"
// and commas ignored, months are 30 days and years 365 days.
func ParseDuration(s string) (time.Duration, error) {
	in := strings.ToLower(strings.TrimSpace(s))
	if in == "" {
		return 0, fmt.Errorf("empty duration")
	}
	if durationClockRe.MatchString(in) {
		parts := strings.Split(in, ":")
		units := []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour}
		var total time.Duration
		for i := range parts {
			n, err := strconv.ParseInt(parts[len(parts)-1-i], 10, 64)
			if err != nil || n > 1e9 {
				return 0, fmt.Errorf("invalid duration %q", s)
			}
			total += time.Duration(n) * units[i]
		}
		return total, nil
	}
	in = strings.ReplaceAll(in, ",", " ")
	in = durationAndRe.ReplaceAllString(in, " ")
	in = numerize(in)
	var total float64
	terms := 0
	for strings.TrimSpace(in) != "" {
		m := durationTermRe.FindStringSubmatch(in)
		if m == nil {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		n, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		unit := time.Second
		if m[2] != "" {
			u, ok := durationUnits[m[2]]
			if !ok {
				return 0, fmt.Errorf("invalid duration %q: unknown unit %q", s, m[2])
			}
			unit = u
		}
		total += n * float64(unit)
		if total > float64(math.MaxInt64/2) {
			return 0, fmt.Errorf("duration %q is too long", s)
		}
		terms++
		in = in[len(m[0]):]
	}
	if terms == 0 {
		return 0, fmt.Errorf("invalid duration %q", s)
	}
	return time.Duration(total).Round(time.Second), nil
}

var (
	smallNumbers = map[string]int{"zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5,
		"six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
		"thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17,
		"eighteen": 18, "nineteen": 19}
	tensNumbers = map[string]int{"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50,
		"sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90}
)

// numerize turns number words into digits ("one week" → "1 week",
// "twenty-one days" → "21 days", "two hundred hours" → "200 hours"), as
// ChronicDuration does with its Numerizer before parsing.
func numerize(in string) string {
	words := strings.Fields(numberHyphenRe.ReplaceAllString(in, "$1 $2"))
	var out []string
	n, have := 0, false
	flush := func() {
		if have {
			out = append(out, strconv.Itoa(n))
		}
		n, have = 0, false
	}
	for _, w := range words {
		switch {
		case smallNumbers[w] != 0 || w == "zero":
			if have && n%10 != 0 {
				flush()
			}
			n, have = n+smallNumbers[w], true
		case tensNumbers[w] != 0:
			if have && n%100 != 0 {
				flush()
			}
			n, have = n+tensNumbers[w], true
		case w == "hundred" && have:
			n *= 100
		default:
			flush()
			out = append(out, w)
		}
	}
	flush()
	return strings.Join(out, " ")
}

// formatDuration prints a duration as GitLab's human form, for messages.
func formatDuration(d time.Duration) string {
	if d%(24*time.Hour) == 0 && d >= 24*time.Hour {
		n := int64(d / (24 * time.Hour))
		if n%7 == 0 {
			return plural(n/7, "week")
		}
		return plural(n, "day")
	}
	return d.String()
}

func plural(n int64, unit string) string {
	if n == 1 {
		return "1 " + unit
	}
	return strconv.FormatInt(n, 10) + " " + unit + "s"
}

func itoa(i int) string { return strconv.Itoa(i) }
