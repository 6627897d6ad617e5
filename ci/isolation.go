package ci

import (
	"strings"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runnerapi"
)

// isolationNames are the values of the isolation keyword and of the
// BERTH_ISOLATION variable, weakest first.
var isolationNames = func() []string {
	out := make([]string, len(executor.Isolations))
	for i, l := range executor.Isolations {
		out[i] = string(l)
	}
	return out
}()

// isolationKeyword parses the isolation keyword (job or default).
func (c *compiler) isolationKeyword(n *node, at string) executor.Isolation {
	s, ok := c.oneOf(n, at, isolationNames...)
	if !ok {
		return ""
	}
	return executor.Isolation(s)
}

// checkIsolationVar checks the value of a variable named BERTH_ISOLATION
// written in the configuration at pos. Other variables pass. An empty value
// asks for nothing (it lets a job unset a global BERTH_ISOLATION).
func (c *compiler) checkIsolationVar(key, value string, pos Pos, at string) {
	if key != runnerapi.IsolationVariable || value == "" {
		return
	}
	if _, err := executor.ParseIsolation(value); err != nil {
		c.d.errorf(pos, "%s should be one of %s, found %q", at, strings.Join(isolationNames, ", "), value)
	}
}

// checkIsolationVars checks BERTH_ISOLATION in a mapping of plain
// variables (rules:variables).
func (c *compiler) checkIsolationVars(n *node, at string) {
	if n == nil || n.kind != kMap {
		return
	}
	for _, e := range n.m {
		if e.val.kind == kScalar {
			c.checkIsolationVar(e.key, e.val.str, e.val.pos, at+":"+e.key)
		}
	}
}

// checkCallerIsolation checks BERTH_ISOLATION among the caller's (project
// or pipeline) variables. They were not written in the file, so the error
// names the main file without a line.
func (c *compiler) checkCallerIsolation(file string) {
	v, ok := c.env.Variables[runnerapi.IsolationVariable]
	if !ok || v == "" {
		return
	}
	if _, err := executor.ParseIsolation(v); err != nil {
		c.d.errorf(Pos{File: file}, "variable %s (a project or pipeline variable) should be one of %s, found %q",
			runnerapi.IsolationVariable, strings.Join(isolationNames, ", "), v)
	}
}

// jobIsolation is the level a job asks for: the stronger of its isolation
// keyword (own or from default:) and the BERTH_ISOLATION variable as the
// job sees it (YAML variables, rules variables, then the caller's, which
// win). Empty when neither names a level.
func (c *compiler) jobIsolation(keyword executor.Isolation, vars []Variable) executor.Isolation {
	val := ""
	for _, v := range vars {
		if v.Key == runnerapi.IsolationVariable {
			val = v.Value
		}
	}
	if v, ok := c.env.Variables[runnerapi.IsolationVariable]; ok {
		val = v
	}
	fromVar, _ := executor.ParseIsolation(val) // invalid values are errors already
	return stronger(keyword, fromVar)
}

// stronger returns the stronger of two isolation levels; an empty level
// (nothing asked) loses to any other.
func stronger(a, b executor.Isolation) executor.Isolation {
	if a == "" || (b != "" && b.Rank() > a.Rank()) {
		return b
	}
	return a
}
