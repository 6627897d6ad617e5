package config

import (
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary documents to the loader: it must never panic,
// and whatever it accepts must validate and name its warnings.
func FuzzParse(f *testing.F) {
	f.Add(gitlabConfig)
	f.Add(s3CacheConfig)
	f.Add("concurrent = 1\n[[runners]]\nurl=\"http://h\"\ntoken=\"t\"\nexecutor=\"shell\"\n")
	f.Add("[[runners]]\n[runners.docker]\n'a.b' = \"\"\"\nx = 1\n\"\"\"\n")
	f.Add("a.b.c = 1\n[x]\n[[x.y]]\n")
	f.Fuzz(func(t *testing.T, doc string) {
		c, warns, err := Parse("f.toml", []byte(doc))
		for _, w := range warns {
			if w.Key == "" || w.Msg == "" || !strings.HasPrefix(w.String(), "f.toml") {
				t.Fatalf("bad warning %+v", w)
			}
		}
		if err != nil {
			return
		}
		if verr := c.Validate(); verr != nil {
			t.Fatalf("accepted a config that does not validate: %v", verr)
		}
	})
}
