package token

import (
	"errors"
	"strings"
	"testing"
)

// TestRoutableGitLabExample: the worked example of the reference
// (gitlab-next.md §1.2): random bytes 00..0f, cell 1, organization 1,
// project 1234, user 42.
func TestRoutableGitLabExample(t *testing.T) {
	rnd := make([]byte, 16)
	for i := range rnd {
		rnd[i] = byte(i)
	}
	r := Routing{Cell: 1, Organization: 1, Project: 1234, User: 42}
	got, err := encodeRoutable("glrt-t3_", rnd, r)
	if err != nil {
		t.Fatal(err)
	}
	const want = "glrt-t3_AAECAwQFBgcICQoLDA0OD2M6MQpvOjEKcDp5YQp1OjE2EQ.01.1a18gz2ql"
	if got != want {
		t.Fatalf("encoded\n%s\nwant\n%s", got, want)
	}
	back, err := ParseRoutable(want)
	if err != nil || back != r {
		t.Fatalf("decoded %+v %v, want %+v", back, err, r)
	}
}

func TestRoutableRoundTrip(t *testing.T) {
	for _, tt := range []struct {
		prefix string
		r      Routing
	}{
		{"glrt-t1_", Routing{Cell: 7}},
		{"glrt-t2_", Routing{Cell: 2, Organization: 1, Group: 99, User: 1 << 40}},
		{"glrtr-", Routing{Cell: 123456789, Project: 5}},
		{PrefixRegistration, Routing{Cell: 3, RunnerType: 1}},
		{"", Routing{Organization: 1}},
	} {
		tok, err := NewRoutable(tt.prefix, tt.r)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(tok, tt.prefix) || KindOf(tok) != KindOf(tt.prefix+"x") {
			t.Errorf("%q: prefix or kind lost", tok)
		}
		got, err := ParseRoutable(tok)
		if err != nil || got != tt.r {
			t.Errorf("%q: decoded %+v %v, want %+v", tok, got, err, tt.r)
		}
		again, _ := NewRoutable(tt.prefix, tt.r)
		if again == tok {
			t.Errorf("two tokens are the same: %q", tok)
		}
	}
}

// TestRoutableRejects: what is not a v1 routable token, or was altered,
// is ErrNotRoutable.
func TestRoutableRejects(t *testing.T) {
	good, err := NewRoutable("glrt-t1_", Routing{Cell: 2, Organization: 1})
	if err != nil {
		t.Fatal(err)
	}
	flip := func(s string, i int) string {
		b := []byte(s)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}
	for name, tok := range map[string]string{
		"empty":          "",
		"plain glrt":     NewRunnerAuth(ScopeInstance),
		"job token":      NewJob(),
		"payload bit":    flip(good, 12),
		"checksum":       flip(good, len(good)-1),
		"version":        strings.Replace(good, ".01.", ".02.", 1),
		"short":          good[:10],
		"length too big": good[:len(good)-9] + "zz" + good[len(good)-7:],
	} {
		if r, err := ParseRoutable(tok); !errors.Is(err, ErrNotRoutable) {
			t.Errorf("%s %q: %+v, %v; want ErrNotRoutable", name, tok, r, err)
		}
	}
	if _, err := NewRoutable("glrt-", Routing{}); err == nil {
		t.Error("a token routing nowhere was minted")
	}
	if _, err := NewRoutable("x", Routing{Cell: 1 << 62, Organization: 1 << 62, Group: 1 << 62, Project: 1 << 62, User: 1 << 62, RunnerType: 1 << 62}); err != nil {
		t.Errorf("the largest payload: %v", err)
	}
}

func FuzzParseRoutable(f *testing.F) {
	f.Add("glrt-t3_AAECAwQFBgcICQoLDA0OD2M6MQpvOjEKcDp5YQp1OjE2EQ.01.1a18gz2ql")
	f.Add("glrt-t1_abc.01.1a0000000")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRoutable(s)
		if err != nil {
			return
		}
		// Whatever decodes re-encodes with the same routing.
		tok, err := NewRoutable("glrt-", r)
		if err != nil {
			t.Fatalf("%q decoded to %+v, which does not encode: %v", s, r, err)
		}
		if back, err := ParseRoutable(tok); err != nil || back != r {
			t.Fatalf("%+v → %q → %+v %v", r, tok, back, err)
		}
	})
}
