package network

import (
	"net/http"
	"testing"
	"time"
)

func TestParseRange(t *testing.T) {
	for in, want := range map[string]int64{"0-0": 0, "0-15": 15, " 0-1024 ": 1024, "bytes=0-5": 5} {
		if got, err := ParseRange(in); err != nil || got != want {
			t.Errorf("ParseRange(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "15", "1-5", "0-", "0--1", "0-x", "a-b"} {
		if _, err := ParseRange(in); err == nil {
			t.Errorf("ParseRange(%q) accepted", in)
		}
	}
}

func TestParseRetryAfterAndRateLimitReset(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	if d, ok := ParseRetryAfter("60", now); !ok || d != time.Minute {
		t.Errorf("60 → %v %v", d, ok)
	}
	if d, ok := ParseRetryAfter(now.Add(30*time.Second).Format(http.TimeFormat), now); !ok || d != 30*time.Second {
		t.Errorf("date → %v %v", d, ok)
	}
	for _, bad := range []string{"", "-1", "soon", "99999999999"} {
		if _, ok := ParseRetryAfter(bad, now); ok {
			t.Errorf("Retry-After %q accepted", bad)
		}
	}
	if d, ok := ParseRateLimitReset(now.Add(5*time.Second).Format(time.RFC1123), now); !ok || d != 5*time.Second {
		t.Errorf("reset → %v %v", d, ok)
	}
	if d, ok := ParseRateLimitReset(now.Add(-5*time.Second).Format(time.RFC1123), now); !ok || d != 0 {
		t.Errorf("past reset → %v %v", d, ok)
	}
	if _, ok := ParseRateLimitReset("tomorrow", now); ok {
		t.Error("bad reset accepted")
	}
	if d, ok := ParseTraceUpdateInterval("3600"); !ok || d != 15*time.Minute {
		t.Errorf("interval cap: %v", d)
	}
}

func FuzzParseRange(f *testing.F) {
	for _, s := range []string{"0-10", "bytes=0-1", "0-", "-", "0-9999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseRange(s)
		if err == nil && n < 0 {
			t.Fatalf("ParseRange(%q) = %d", s, n)
		}
	})
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"1", "Sun, 22 Nov 2026 10:00:00 GMT", "-5", "1e3"} {
		f.Add(s)
	}
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		if d, ok := ParseRetryAfter(s, now); ok && (d < 0 || d > time.Hour) {
			t.Fatalf("ParseRetryAfter(%q) = %v", s, d)
		}
	})
}

func FuzzParseRateLimitReset(f *testing.F) {
	for _, s := range []string{"Sun, 22 Nov 2026 10:00:05 GMT", "Mon, 02 Jan 2006 15:04:05 MST", ""} {
		f.Add(s)
	}
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		if d, ok := ParseRateLimitReset(s, now); ok && (d < 0 || d > time.Hour) {
			t.Fatalf("ParseRateLimitReset(%q) = %v", s, d)
		}
	})
}
