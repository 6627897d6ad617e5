package webui

import (
	"net/url"
	"strings"
	"testing"
)

// The parsers of what browsers send: the session cookie, the sign-in's
// return path, the pipeline filter, a log stream's range and a path in an
// artifact archive.

func FuzzParseSecret(f *testing.F) {
	f.Add(newSecret())
	f.Add(strings.Repeat("A", 43))
	f.Add("")
	f.Fuzz(func(t *testing.T, v string) {
		s, ok := parseSecret(v)
		if ok && (s != v || len(s) != 43 || strings.ContainsAny(s, "=+/ ;")) {
			t.Fatalf("accepted %q as %q", v, s)
		}
	})
}

func FuzzReturnPath(f *testing.F) {
	for _, s := range []string{"/", "/-/runners?x=1", "//evil", "/\\evil", "https://x", "/a/-/jobs/1#L3", "/%2F%2Fevil", "/\t/evil"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p := returnPath(s)
		if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.HasPrefix(p, "/\\") {
			t.Fatalf("returnPath(%q) = %q leaves the site", s, p)
		}
		u, err := url.Parse(p)
		if err != nil || u.Host != "" || u.Scheme != "" {
			t.Fatalf("returnPath(%q) = %q: %v %+v", s, p, err, u)
		}
		// What a browser makes of it stays on the site too.
		base, _ := url.Parse("http://berth.example/x/y")
		if r := base.ResolveReference(u); r.Host != "berth.example" {
			t.Fatalf("returnPath(%q) = %q resolves to %s", s, p, r)
		}
	})
}

func FuzzParsePipelineQuery(f *testing.F) {
	f.Add("status=passed&ref=main&sha=abc&page=2")
	f.Add("page=0&status=%00")
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		pq, err := parsePipelineQuery(q)
		if err != nil {
			return
		}
		if pq.Page < 1 || pq.Page > 10000 || len(pq.Ref) > 255 || len(pq.Sha) > 40 || (pq.Status != "" && !pq.Status.Valid()) {
			t.Fatalf("accepted %q as %+v", raw, pq)
		}
		// Its URL reads back the same.
		u, _ := url.Parse(pq.URL("/p/-/pipelines", pq.Page))
		again, err := parsePipelineQuery(u.Query())
		if err != nil || again != pq {
			t.Fatalf("%+v → %s → %+v, %v", pq, u, again, err)
		}
	})
}

func FuzzParseLogRange(f *testing.F) {
	f.Add("0", "10")
	f.Add("-1", "x")
	f.Fuzz(func(t *testing.T, from, offset string) {
		a, b, err := parseLogRange(from, offset)
		if err == nil && (a < 0 || b < a) {
			t.Fatalf("(%q, %q) = %d, %d", from, offset, a, b)
		}
	})
}

func FuzzCleanEntryPath(f *testing.F) {
	for _, s := range []string{"", "a/b", "../a", "a//b", "/a/", "a/./b", "a\\b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		c, ok := cleanEntryPath(p)
		if !ok {
			return
		}
		if strings.HasPrefix(c, "/") || strings.HasSuffix(c, "/") || strings.Contains(c, "//") {
			t.Fatalf("%q → %q", p, c)
		}
		for _, part := range strings.Split(c, "/") {
			if c != "" && (part == ".." || part == "." || part == "") {
				t.Fatalf("%q → %q", p, c)
			}
		}
	})
}
