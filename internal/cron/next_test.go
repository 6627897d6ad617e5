package cron

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

func mustLoad(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("time zone %s: %v", name, err)
	}
	return loc
}

func TestNext(t *testing.T) {
	utc := time.UTC
	ny := mustLoad(t, "America/New_York")
	tokyo := mustLoad(t, "Asia/Tokyo")
	kolkata := mustLoad(t, "Asia/Kolkata")
	lordHowe := mustLoad(t, "Australia/Lord_Howe") // clocks move by 30 minutes
	at := func(loc *time.Location, y int, mo time.Month, d, h, mi int) time.Time {
		return time.Date(y, mo, d, h, mi, 0, 0, loc)
	}
	tests := []struct {
		name string
		expr string
		loc  *time.Location
		from time.Time
		want time.Time // zero: never
	}{
		{"every minute, strictly after", "* * * * *", utc, at(utc, 2024, 1, 1, 10, 0), at(utc, 2024, 1, 1, 10, 1)},
		{"seconds are dropped", "* * * * *", utc, at(utc, 2024, 1, 1, 10, 0).Add(59 * time.Second), at(utc, 2024, 1, 1, 10, 1)},
		{"later today", "30 14 * * *", utc, at(utc, 2024, 1, 1, 10, 0), at(utc, 2024, 1, 1, 14, 30)},
		{"tomorrow", "30 9 * * *", utc, at(utc, 2024, 1, 1, 10, 0), at(utc, 2024, 1, 2, 9, 30)},
		{"the same minute is not next", "0 10 * * *", utc, at(utc, 2024, 1, 1, 10, 0), at(utc, 2024, 1, 2, 10, 0)},
		{"weekdays from a Friday evening", "0 8 * * mon-fri", utc, at(utc, 2024, 1, 5, 18, 0), at(utc, 2024, 1, 8, 8, 0)},
		{"month rollover", "0 0 1 * *", utc, at(utc, 2024, 1, 31, 23, 59), at(utc, 2024, 2, 1, 0, 0)},
		{"year rollover", "0 0 1 1 *", utc, at(utc, 2024, 6, 1, 0, 0), at(utc, 2025, 1, 1, 0, 0)},
		{"31st skips short months", "0 12 31 * *", utc, at(utc, 2024, 4, 1, 0, 0), at(utc, 2024, 5, 31, 12, 0)},
		{"29 February from a leap year", "0 0 29 2 *", utc, at(utc, 2024, 3, 1, 0, 0), at(utc, 2028, 2, 29, 0, 0)},
		{"29 February across 2100", "0 0 29 2 *", utc, at(utc, 2096, 3, 1, 0, 0), at(utc, 2104, 2, 29, 0, 0)},
		{"30 February never", "0 0 30 2 *", utc, at(utc, 2024, 1, 1, 0, 0), time.Time{}},
		{"either day field (Vixie)", "0 0 13 * fri", utc, at(utc, 2024, 1, 1, 0, 0), at(utc, 2024, 1, 5, 0, 0)},
		{"step", "*/20 * * * *", utc, at(utc, 2024, 1, 1, 10, 41), at(utc, 2024, 1, 1, 11, 0)},
		{"@daily", "@daily", utc, at(utc, 2024, 1, 1, 10, 0), at(utc, 2024, 1, 2, 0, 0)},
		{"@hourly", "@hourly", utc, at(utc, 2024, 1, 1, 10, 5), at(utc, 2024, 1, 1, 11, 0)},
		{"@weekly is Sunday", "@weekly", utc, at(utc, 2024, 1, 1, 10, 0), at(utc, 2024, 1, 7, 0, 0)},
		{"@noon", "@noon", utc, at(utc, 2024, 1, 1, 12, 0), at(utc, 2024, 1, 2, 12, 0)},
		{"in the zone's wall clock", "0 9 * * *", tokyo, at(utc, 2023, 12, 31, 23, 0), at(tokyo, 2024, 1, 1, 9, 0)},
		{"half-hour offset", "0 * * * *", kolkata, at(kolkata, 2024, 1, 1, 10, 30), at(kolkata, 2024, 1, 1, 11, 0)},
		// New York: clocks go forward 2024-03-10 02:00 → 03:00, back
		// 2024-11-03 02:00 → 01:00.
		{"skipped hour does not happen", "30 2 * * *", ny, at(ny, 2024, 3, 9, 12, 0), at(ny, 2024, 3, 11, 2, 30)},
		{"hourly across the gap", "30 * * * *", ny, at(ny, 2024, 3, 10, 1, 30), at(ny, 2024, 3, 10, 3, 30)},
		{"a time after the gap", "0 3 * * *", ny, at(ny, 2024, 3, 9, 12, 0), at(ny, 2024, 3, 10, 3, 0)},
		{"repeated minute once, first time", "30 1 * * *", ny, at(ny, 2024, 11, 2, 12, 0), time.Date(2024, 11, 3, 5, 30, 0, 0, utc)},
		{"repeated minute not again", "30 1 * * *", ny, time.Date(2024, 11, 3, 5, 30, 0, 0, utc), at(ny, 2024, 11, 4, 1, 30)},
		{"hourly through the repeated hour", "0 * * * *", ny, time.Date(2024, 11, 3, 5, 0, 0, 0, utc), time.Date(2024, 11, 3, 7, 0, 0, 0, utc)},
		// Lord Howe: back 2024-04-07 02:00 → 01:30, forward 2024-10-06 02:00 → 02:30.
		{"30-minute repeat", "45 1 * * *", lordHowe, time.Date(2024, 4, 6, 14, 45, 0, 0, utc), at(lordHowe, 2024, 4, 8, 1, 45)},
		{"30-minute gap", "15 2 * * *", lordHowe, at(lordHowe, 2024, 10, 5, 12, 0), at(lordHowe, 2024, 10, 7, 2, 15)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(tt.expr)
			if err != nil {
				t.Fatal(err)
			}
			got := s.Next(tt.from, tt.loc)
			if !got.Equal(tt.want) {
				t.Fatalf("%q.Next(%s) in %s = %s, want %s", tt.expr, tt.from, tt.loc, got, tt.want)
			}
			if !got.IsZero() && got.Location() != tt.loc {
				t.Errorf("result in %s, want %s", got.Location(), tt.loc)
			}
		})
	}
}

// TestNextAgainstScan compares Next with a scan of every minute, in zones
// with and without clock changes, for random expressions and times.
func TestNextAgainstScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	zones := []*time.Location{time.UTC, mustLoad(t, "Europe/Berlin"), mustLoad(t, "America/Santiago"), mustLoad(t, "Australia/Lord_Howe")}
	field := func(lo, hi int) string {
		switch rng.IntN(5) {
		case 0:
			return "*"
		case 1:
			return "*/" + strconv.Itoa(1+rng.IntN(hi-lo))
		case 2:
			a := lo + rng.IntN(hi-lo+1)
			b := a + rng.IntN(hi-a+1)
			return strconv.Itoa(a) + "-" + strconv.Itoa(b)
		case 3:
			return strconv.Itoa(lo+rng.IntN(hi-lo+1)) + "," + strconv.Itoa(lo+rng.IntN(hi-lo+1))
		}
		return strconv.Itoa(lo + rng.IntN(hi-lo+1))
	}
	for i := 0; i < 300; i++ {
		expr := field(0, 59) + " " + field(0, 23) + " " + field(1, 31) + " " + field(1, 12) + " " + field(0, 7)
		s := MustParse(expr)
		loc := zones[i%len(zones)]
		from := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(rng.Int64N(int64(2 * 365 * 24 * time.Hour))))
		got := s.Next(from, loc)
		want := scan(s, from, loc, 3*366*24*60)
		if want.IsZero() {
			if !got.IsZero() && !s.Match(got) {
				t.Errorf("%q from %s in %s: %s does not match", expr, from, loc, got)
			}
			continue
		}
		if !got.Equal(want) {
			t.Errorf("%q from %s in %s: Next = %s, scan = %s", expr, from, loc, got, want)
		}
	}
}

// scan steps minute by minute (absolute time) and takes the first
// matching minute whose wall clock has not been seen before.
func scan(s Schedule, from time.Time, loc *time.Location, limit int) time.Time {
	t := from.In(loc).Truncate(time.Minute).Add(time.Minute)
	if from.Truncate(time.Minute).Equal(from) {
		t = from.In(loc).Add(time.Minute)
	}
	for i := 0; i < limit; i, t = i+1, t.Add(time.Minute) {
		if !s.Match(t) {
			continue
		}
		first := true
		for back := time.Minute; back <= 3*time.Hour; back += time.Minute {
			e := t.Add(-back)
			if e.Day() == t.Day() && e.Hour() == t.Hour() && e.Minute() == t.Minute() {
				first = false
				break
			}
		}
		if first {
			return t
		}
	}
	return time.Time{}
}

func BenchmarkNext(b *testing.B) {
	loc := mustLoad(b, "Europe/Berlin")
	s := MustParse("30 2 29 2 *")
	from := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	for b.Loop() {
		s.Next(from, loc)
	}
}
