package runnerhttp

import (
	"testing"

	"github.com/berthci/berth/runnerapi"
)

func TestGitDepth(t *testing.T) {
	v := func(kv ...string) []runnerapi.Variable {
		var out []runnerapi.Variable
		for i := 0; i < len(kv); i += 2 {
			out = append(out, runnerapi.Variable{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	for _, c := range []struct {
		vars []runnerapi.Variable
		want int
		set  bool
	}{
		{v("A", "1"), 0, false},
		{v("GIT_DEPTH", "1"), 1, true},
		{v("GIT_DEPTH", "50", "GIT_DEPTH", "3"), 3, true}, // the one that counts is the last
		{v("GIT_DEPTH", "0"), 0, true},
		{v("GIT_DEPTH", ""), 0, true},
		{v("GIT_DEPTH", "abc"), 0, true},
		{v("GIT_DEPTH", " 12abc"), 12, true}, // Ruby's "12abc".to_i
		{v("GIT_DEPTH", "+7"), 7, true},
		{v("GIT_DEPTH", "-5"), 0, true},
	} {
		got, set := gitDepth(c.vars)
		if got != c.want || set != c.set {
			t.Errorf("%v: %d %v, want %d %v", c.vars, got, set, c.want, c.set)
		}
	}
}
