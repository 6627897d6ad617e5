package runner

import (
	"bytes"
	"strings"
	"testing"

	"github.com/berthci/berth/token"
)

func maskAll(secrets, prefixes []string, writes ...string) string {
	var out bytes.Buffer
	m := NewMasker(&out, secrets, prefixes)
	for _, w := range writes {
		m.Write([]byte(w))
	}
	m.Flush()
	return out.String()
}

func TestMasker(t *testing.T) {
	for _, tc := range []struct {
		name     string
		secrets  []string
		writes   []string
		want     string
		prefixes []string
	}{
		{"whole", []string{"s3cr3t-value"}, []string{"a s3cr3t-value b\n"}, "a [MASKED] b\n", nil},
		{"split in two", []string{"s3cr3t-value"}, []string{"a s3cr3", "t-value b\n"}, "a [MASKED] b\n", nil},
		{"split byte by byte", []string{"abcdef"}, strings.Split("xxabcdefyy", ""), "xx[MASKED]yy", nil},
		{"longest wins", []string{"abc", "abcdef"}, []string{"abcdef abc"}, "[MASKED] [MASKED]", nil},
		{"prefix at end not a secret", []string{"secret"}, []string{"sec", "ond"}, "second", nil},
		{"partial at flush", []string{"secret"}, []string{"the sec"}, "the sec", nil},
		{"token prefix", nil, []string{"token glpat-abcDEF_123 end"}, "token glpat-[MASKED] end", token.MaskPrefixes},
		{"token split", nil, []string{"x glcb", "t-abc", "def\n"}, "x glcbt-[MASKED]\n", token.MaskPrefixes},
		{"token at flush", nil, []string{"glrt-t1_abc"}, "glrt-[MASKED]", token.MaskPrefixes},
		{"bare prefix", nil, []string{"glpat- alone"}, "glpat- alone", token.MaskPrefixes},
		{"many", []string{"one1", "two2"}, []string{"one1two2one", "1"}, "[MASKED][MASKED][MASKED]", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := maskAll(tc.secrets, tc.prefixes, tc.writes...); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// FuzzMasker: whatever the split of the stream, no secret survives, and
// the output equals masking the stream in one write.
func FuzzMasker(f *testing.F) {
	f.Add("hello secret-1 world glpat-xyz", "secret-1", uint8(3))
	f.Add("sesecret-1cret-1", "secret-1", uint8(1))
	f.Add("glcbt-glcbt-aaa", "aaa", uint8(2))
	f.Fuzz(func(t *testing.T, stream, secret string, step uint8) {
		if len(secret) < 3 || strings.ContainsAny(secret, "[]") {
			return
		}
		n := int(step%16) + 1
		var chunks []string
		for i := 0; i < len(stream); i += n {
			chunks = append(chunks, stream[i:min(i+n, len(stream))])
		}
		got := maskAll([]string{secret}, token.MaskPrefixes, chunks...)
		whole := maskAll([]string{secret}, token.MaskPrefixes, stream)
		if got != whole {
			t.Fatalf("split %d: %q, whole: %q", n, got, whole)
		}
		if strings.Contains(got, secret) && !strings.Contains(maskText, secret) {
			// A secret may only reappear when the masking itself creates
			// it (e.g. secret "ASKED]" next to "[M"); check it is not in
			// the parts of the stream that were not replaced.
			if !strings.Contains(strings.ReplaceAll(got, maskText, "\x00"), secret) {
				return
			}
			t.Fatalf("secret %q survives in %q", secret, got)
		}
	})
}
