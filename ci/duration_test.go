package ci

import (
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"3600", time.Hour},
		{"90 seconds", 90 * time.Second},
		{"30 minutes", 30 * time.Minute},
		{"30 min", 30 * time.Minute},
		{"1h", time.Hour},
		{"1h 30m", 90 * time.Minute},
		{"1h30m", 90 * time.Minute},
		{"3 hours 30 minutes", 3*time.Hour + 30*time.Minute},
		{"1 hour and 30 minutes", 90 * time.Minute},
		{"1 hour, 30 minutes", 90 * time.Minute},
		{"1.5 hours", 90 * time.Minute},
		{"2 days", 48 * time.Hour},
		{"1 week", 7 * 24 * time.Hour},
		{"1 wk", 7 * 24 * time.Hour},
		{"1 month", 30 * 24 * time.Hour},
		{"1 year", 365 * 24 * time.Hour},
		{"1:30", 90 * time.Second},
		{"1:30:00", 90 * time.Minute},
		{"10 Minutes", 10 * time.Minute},
		{"2 hrs 5 secs", 2*time.Hour + 5*time.Second},
		// Number words, as ChronicDuration's Numerizer reads them.
		{"one week", 7 * 24 * time.Hour},
		{"Two Days", 48 * time.Hour},
		{"twenty-one days", 21 * 24 * time.Hour},
		{"thirty five minutes", 35 * time.Minute},
		{"one hundred hours", 100 * time.Hour},
	}
	for _, tt := range tests {
		got, err := ParseDuration(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "soon", "1 fortnight", "h", "1h x", "-5", "99999999999999999999 years", "an hour", "hundred days"} {
		if d, err := ParseDuration(bad); err == nil {
			t.Errorf("ParseDuration(%q) = %v, want an error", bad, d)
		}
	}
}
