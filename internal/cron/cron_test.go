package cron

import (
	"errors"
	"testing"
	"time"
)

func TestMatch(t *testing.T) {
	// 2024-01-01 is a Monday.
	at := func(month time.Month, day, hour, minute int) time.Time {
		return time.Date(2024, month, day, hour, minute, 30, 0, time.UTC)
	}
	tests := []struct {
		expr string
		t    time.Time
		want bool
	}{
		{"* * * * *", at(1, 1, 0, 0), true},
		{"* 8-18 * * mon-fri", at(1, 1, 8, 0), true},
		{"* 8-18 * * mon-fri", at(1, 1, 18, 59), true},
		{"* 8-18 * * mon-fri", at(1, 1, 19, 0), false},
		{"* 8-18 * * mon-fri", at(1, 1, 7, 59), false},
		{"* 8-18 * * mon-fri", at(1, 6, 10, 0), false}, // Saturday
		{"* 8-18 * * MON-FRI", at(1, 5, 10, 0), true},  // Friday
		{"* * * * 0", at(1, 7, 10, 0), true},           // Sunday as 0
		{"* * * * 7", at(1, 7, 10, 0), true},           // Sunday as 7
		{"* * * * sun", at(1, 7, 10, 0), true},
		{"* * * * 7", at(1, 6, 10, 0), false},
		{"*/15 * * * *", at(1, 1, 3, 45), true},
		{"*/15 * * * *", at(1, 1, 3, 44), false},
		{"5/20 * * * *", at(1, 1, 3, 45), true},
		{"5/20 * * * *", at(1, 1, 3, 46), false},
		{"0-30/10 * * * *", at(1, 1, 3, 30), true},
		{"0-30/10 * * * *", at(1, 1, 3, 40), false},
		{"0,30 9,17 * * *", at(1, 1, 17, 30), true},
		{"0,30 9,17 * * *", at(1, 1, 17, 31), false},
		{"* * 1 jan *", at(1, 1, 12, 0), true},
		{"* * 1 jan *", at(2, 1, 12, 0), false},
		{"* * * dec *", at(12, 24, 12, 0), true},
		// Both day fields restricted: either matches (Vixie cron).
		{"* * 15 * mon", at(1, 15, 0, 0), true}, // the 15th is a Monday anyway
		{"* * 15 * fri", at(1, 15, 0, 0), true}, // the 15th, not a Friday
		{"* * 15 * fri", at(1, 19, 0, 0), true}, // a Friday, not the 15th
		{"* * 15 * fri", at(1, 16, 0, 0), false},
		// One restricted: both must match.
		{"* * */2 * *", at(1, 2, 0, 0), false},
		{"* * */2 * *", at(1, 3, 0, 0), true},
		{"* * * * 1-5/2", at(1, 3, 0, 0), true},  // Wednesday
		{"* * * * 1-5/2", at(1, 2, 0, 0), false}, // Tuesday
	}
	for _, tt := range tests {
		s, err := Parse(tt.expr)
		if err != nil {
			t.Fatalf("Parse(%q): %v", tt.expr, err)
		}
		if got := s.Match(tt.t); got != tt.want {
			t.Errorf("%q.Match(%s) = %v, want %v", tt.expr, tt.t.Format("Mon 2006-01-02 15:04"), got, tt.want)
		}
	}
}

func TestMatchUsesLocation(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skip("no time zone database:", err)
	}
	s := MustParse("* 9-17 * * *")
	utc := time.Date(2024, 1, 1, 8, 30, 0, 0, time.UTC) // 09:30 in Berlin
	if s.Match(utc) {
		t.Error("08:30 UTC matched 9-17")
	}
	if !s.Match(utc.In(berlin)) {
		t.Error("09:30 Berlin did not match 9-17")
	}
}

func TestParseErrors(t *testing.T) {
	for _, expr := range []string{
		"", "* * * *", "* * * * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * 32 * *",
		"* * * 13 *", "* * * * 8", "5-1 * * * *", "*/0 * * * *", "*/x * * * *", "a * * * *",
		"1- * * * *", "-1 * * * *", ", * * * *", "* * * foo *", "*/61 * * * *", "@reboot", "@every 5m", "@daily *",
	} {
		_, err := Parse(expr)
		if err == nil {
			t.Errorf("Parse(%q) succeeded", expr)
		} else if !errors.Is(err, ErrSyntax) {
			t.Errorf("Parse(%q) = %v, not ErrSyntax", expr, err)
		}
	}
}

func TestString(t *testing.T) {
	if got := MustParse("  *  8-18 *   * mon-fri ").String(); got != "* 8-18 * * mon-fri" {
		t.Errorf("String() = %q", got)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"* * * * *", "*/15 8-18 1,15 jan-mar mon-fri", "5/20 * * * 7", "0 0 * * sun", "@daily", "0 0 30 2 *"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		s, err := Parse(expr)
		if err != nil {
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("error not ErrSyntax: %v", err)
			}
			return
		}
		// A parsed schedule reparses to the same matcher.
		again, err := Parse(s.String())
		if err != nil {
			t.Fatalf("reparse of %q: %v", s.String(), err)
		}
		if again != s {
			t.Fatalf("reparse of %q differs", s.String())
		}
		from := time.Date(2024, 2, 29, 12, 0, 0, 0, time.UTC)
		_ = s.Match(from)
		if next := s.Next(from, time.UTC); !next.IsZero() && (!next.After(from) || !s.Match(next)) {
			t.Fatalf("%q.Next(%s) = %s: not after it, or not matching", expr, from, next)
		}
	})
}
