package token

import (
	"strings"
	"testing"
)

func TestMintedTokensHaveTheirKind(t *testing.T) {
	cases := []struct {
		tok    string
		kind   Kind
		prefix string
	}{
		{NewRegistration(), Registration, "GR1348941"},
		{NewRunnerAuth(ScopeInstance), RunnerAuth, "glrt-t1_"},
		{NewRunnerAuth(ScopeGroup), RunnerAuth, "glrt-t2_"},
		{NewRunnerAuth(ScopeProject), RunnerAuth, "glrt-t3_"},
		{NewRunnerAuthLegacy(), RunnerAuthLegacy, "glrtr-"},
		{NewJob(), Job, "glcbt-"},
		{NewPersonal(), Personal, "glpat-"},
		{NewTrigger(), Trigger, "glptt-"},
	}
	for _, c := range cases {
		if !strings.HasPrefix(c.tok, c.prefix) {
			t.Errorf("%q does not start with %q", c.tok, c.prefix)
		}
		if got := KindOf(c.tok); got != c.kind {
			t.Errorf("KindOf(%q) = %v, want %v", c.tok, got, c.kind)
		}
		if len(c.tok) < len(c.prefix)+32 {
			t.Errorf("%q too short", c.tok)
		}
	}
	if KindOf("hello") != Unknown {
		t.Error("unknown prefix recognised")
	}
}

func TestTokensAreUnique(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		tok := NewJob()
		if seen[tok] {
			t.Fatalf("duplicate token after %d", i)
		}
		seen[tok] = true
	}
}

func TestDigestAndEqual(t *testing.T) {
	d := Digest("glrt-abc")
	if len(d) != 64 || strings.ToLower(d) != d {
		t.Fatalf("digest %q is not lower-case hex sha256", d)
	}
	if d != Digest("glrt-abc") || d == Digest("glrt-abd") {
		t.Fatal("digest not deterministic or collides")
	}
	if !Equal(d, Digest("glrt-abc")) || Equal(d, Digest("x")) || Equal(d, d[:10]) {
		t.Fatal("Equal wrong")
	}
}

func TestShort(t *testing.T) {
	cases := map[string]string{
		"glrt-t1_abcdefghijklmn": "abcdefghi",
		"glrt-abcdefghijklmn":    "abcdefghi",
		"glrtr-zyxwvutsrqp":      "zyxwvutsr",
		"glcbt-123456789012":     "123456789",
		"GR1348941qwertyuiop":    "qwertyuio",
		"short":                  "short",
	}
	for in, want := range cases {
		if got := Short(in); got != want {
			t.Errorf("Short(%q) = %q, want %q", in, got, want)
		}
	}
}
