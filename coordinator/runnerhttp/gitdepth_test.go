package runnerhttp

import (
	"math"
	"testing"

	"github.com/berthci/berth/runnerapi"
)

func TestGitDepth(t *testing.T) {
	for _, c := range []struct {
		vars []runnerapi.Variable
		want int
		set  bool
	}{
		{kvVars("A", "1"), 0, false},
		{kvVars("GIT_DEPTH", "1"), 1, true},
		{kvVars("GIT_DEPTH", "50", "GIT_DEPTH", "3"), 3, true}, // the one that counts is the last
		{kvVars("GIT_DEPTH", "0"), 0, true},
		{kvVars("GIT_DEPTH", ""), 0, true},
		{kvVars("GIT_DEPTH", "abc"), 0, true},
		{kvVars("GIT_DEPTH", " 12abc"), 12, true}, // Ruby's "12abc".to_i
		{kvVars("GIT_DEPTH", "+7"), 7, true},
		{kvVars("GIT_DEPTH", "-5"), 0, true},
		{kvVars("GIT_DEPTH", "1_0"), 10, true}, // Ruby's to_i reads underscores between digits
		{kvVars("GIT_DEPTH", "99999999999999999999"), math.MaxInt32, true},
	} {
		got, set := gitDepth(c.vars)
		if got != c.want || set != c.set {
			t.Errorf("%v: %d %v, want %d %v", c.vars, got, set, c.want, c.set)
		}
	}
}

// kvVars is the variables of key, value pairs.
func kvVars(kv ...string) []runnerapi.Variable {
	var out []runnerapi.Variable
	for i := 0; i < len(kv); i += 2 {
		out = append(out, runnerapi.Variable{Key: kv[i], Value: kv[i+1]})
	}
	return out
}
