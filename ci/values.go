package ci

import (
	"strconv"
	"strings"
)

// Helpers that read typed values out of nodes and report errors with the
// node's position. "at" is the GitLab-style path of the value, like
// jobs:build:script.

func (c *compiler) str(n *node, at string) (string, bool) {
	if n == nil || n.kind != kScalar || n.tag == "!!bool" {
		c.d.errorf(posOf(n), "%s should be a string, found %s", at, n.describe())
		return "", false
	}
	return n.str, true
}

func (c *compiler) boolean(n *node, at string) (bool, bool) {
	b, ok := yaml11Bool(n)
	if !ok {
		c.d.errorf(posOf(n), "%s should be a boolean, found %s", at, n.describe())
	}
	return b, ok
}

func (c *compiler) integer(n *node, at string) (int, bool) {
	if n != nil && n.kind == kScalar && n.tag == "!!int" {
		v, err := strconv.ParseInt(strings.ReplaceAll(n.str, "_", ""), 0, 32)
		if err == nil {
			return int(v), true
		}
	}
	c.d.errorf(posOf(n), "%s should be an integer, found %s", at, n.describe())
	return 0, false
}

// strList reads a list of strings; single allows a lone string too;
// flatten accepts nested lists (from !reference) and flattens them.
func (c *compiler) strList(n *node, at string, single, flatten bool) ([]string, bool) {
	if n == nil {
		return nil, true
	}
	if n.kind == kScalar && single {
		s, ok := c.str(n, at)
		return []string{s}, ok
	}
	if n.kind != kSeq {
		what := "a list of strings"
		if single {
			what = "a string or a list of strings"
		}
		c.d.errorf(n.pos, "%s should be %s, found %s", at, what, n.describe())
		return nil, false
	}
	out := []string{}
	ok := true
	var walk func(n *node, depth int)
	walk = func(n *node, depth int) {
		for _, x := range n.seq {
			if x.kind == kSeq && flatten && depth < 10 {
				walk(x, depth+1)
				continue
			}
			if x.kind != kScalar || x.tag == "!!bool" {
				c.d.errorf(x.pos, "%s should contain only strings, found %s", at, x.describe())
				ok = false
				continue
			}
			out = append(out, x.str)
		}
	}
	walk(n, 0)
	return out, ok
}

// script reads a script: a string or a list of strings nested up to 10
// levels deep (so !reference can splice in other scripts), flattened.
func (c *compiler) script(n *node, at string) ([]string, bool) {
	if n.kind == kScalar && n.tag == "!!str" {
		return []string{n.str}, true
	}
	if n.kind != kSeq {
		c.d.errorf(posOf(n), "%s should be a string or a list of strings, found %s", at, n.describe())
		return nil, false
	}
	var out []string
	ok := true
	var walk func(n *node, depth int)
	walk = func(n *node, depth int) {
		for _, x := range n.seq {
			switch {
			case x.kind == kSeq:
				if depth >= 10 {
					c.d.errorf(x.pos, "%s is nested more than 10 levels deep", at)
					ok = false
					continue
				}
				walk(x, depth+1)
			case x.kind == kScalar && x.tag == "!!str":
				out = append(out, x.str)
			case x.kind == kMap:
				c.d.errorf(x.pos, "%s line is a mapping, not a string: quote the line if it contains \": \"", at)
				ok = false
			case x.kind == kNull:
				c.d.errorf(x.pos, "%s line is empty (null)", at)
				ok = false
			default:
				c.d.errorf(x.pos, "%s line should be a string, found %s: quote it", at, x.describe())
				ok = false
			}
		}
	}
	walk(n, 1)
	return out, ok
}

// keys reports unknown keys of a mapping; known lists allowed keys.
func (c *compiler) checkKeys(n *node, at string, known ...string) {
	for _, e := range n.m {
		if indexOf(known, e.key) < 0 {
			c.d.errorf(e.keyPos, "%s: unknown keyword %q (allowed: %s)", at, e.key, strings.Join(known, ", "))
		}
	}
}

func (c *compiler) mapping(n *node, at string) bool {
	if n == nil || n.kind != kMap {
		c.d.errorf(posOf(n), "%s should be a mapping, found %s", at, n.describe())
		return false
	}
	return true
}

func posOf(n *node) Pos {
	if n == nil {
		return Pos{}
	}
	return n.pos
}

// oneOf checks that a string is one of the allowed values.
func (c *compiler) oneOf(n *node, at string, allowed ...string) (string, bool) {
	s, ok := c.str(n, at)
	if !ok {
		return "", false
	}
	if indexOf(allowed, s) < 0 {
		c.d.errorf(n.pos, "%s should be one of %s, found %q", at, strings.Join(allowed, ", "), s)
		return s, false
	}
	return s, true
}
