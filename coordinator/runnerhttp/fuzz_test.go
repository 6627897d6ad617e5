package runnerhttp

import (
	"testing"
)

func FuzzParseContentRange(f *testing.F) {
	for _, s := range []string{"0-0", "0-1023", "5-4", "bytes 0-9", "-1-2", "a-b", "", "1", "9223372036854775807-9223372036854775807"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		start, end, err := ParseContentRange(s)
		if err == nil && (start < 0 || end < start) {
			t.Fatalf("%q parsed to %d-%d", s, start, end)
		}
	})
}
