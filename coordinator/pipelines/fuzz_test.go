package pipelines

import (
	"strings"
	"testing"
)

func FuzzParseProjectPath(f *testing.F) {
	for _, s := range []string{"demo", "group/sub/demo", "/a/", "a//b", "-a", "a.", "x.git", "a b", "ü", strings.Repeat("a/", 30)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseProjectPath(s)
		if err != nil {
			return
		}
		if again, err := ParseProjectPath(p); err != nil || again != p {
			t.Fatalf("%q → %q is not stable: %q, %v", s, p, again, err)
		}
		for _, seg := range strings.Split(p, "/") {
			if seg == "" || seg == "." || seg == ".." || strings.HasPrefix(seg, ".") {
				t.Fatalf("%q → %q has segment %q", s, p, seg)
			}
		}
	})
}
