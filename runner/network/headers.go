package network

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ParseRange reads the Range header of a trace PATCH answer, "0-<size>",
// and returns the size: the offset the next PATCH must start at.
func ParseRange(v string) (int64, error) {
	v = strings.TrimSpace(v)
	v = strings.TrimPrefix(v, "bytes=")
	v = strings.TrimPrefix(v, "bytes ")
	start, end, ok := strings.Cut(v, "-")
	if !ok {
		return 0, errors.New("range: want 0-<size>")
	}
	s, err := strconv.ParseInt(strings.TrimSpace(start), 10, 64)
	if err != nil || s != 0 {
		return 0, errors.New("range: want a start of 0")
	}
	e, err := strconv.ParseInt(strings.TrimSpace(end), 10, 64)
	if err != nil || e < 0 {
		return 0, errors.New("range: want a non-negative size after the dash")
	}
	return e, nil
}

// ParseRetryAfter reads Retry-After: delay seconds or an HTTP date, as a
// wait from now. ok is false when the header is absent or malformed.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 || n > maxServerWait/int64(time.Second) {
			return 0, false
		}
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return clampWait(t.Sub(now)), true
	}
	return 0, false
}

// ParseRateLimitReset reads RateLimit-ResetTime, an RFC 1123 date, as a
// wait from now.
func ParseRateLimitReset(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	t, err := time.Parse(time.RFC1123, v)
	if err != nil {
		if t, err = http.ParseTime(v); err != nil {
			return 0, false
		}
	}
	return clampWait(t.Sub(now)), true
}

// maxServerWait bounds a wait a server asks for (a broken clock must not
// park a runner for days).
const maxServerWait = int64(time.Hour)

func clampWait(d time.Duration) time.Duration {
	if d < 0 {
		return 0
	}
	if d > time.Duration(maxServerWait) {
		return time.Duration(maxServerWait)
	}
	return d
}

// ParseTraceUpdateInterval reads X-GitLab-Trace-Update-Interval (seconds),
// capped at 15 minutes; ok is false when absent or not positive.
func ParseTraceUpdateInterval(v string) (time.Duration, bool) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n <= 0 {
		return 0, false
	}
	d := time.Duration(n) * time.Second
	if d > 15*time.Minute {
		d = 15 * time.Minute
	}
	return d, true
}
