package ci

import (
	"strings"
)

// maxReferenceDepth is GitLab's limit on !reference nesting.
const maxReferenceDepth = 10

// resolveRefs replaces every !reference with the value it points at,
// looked up in the configuration after extends, as GitLab's tag resolver
// does. References inside the referenced value are resolved too.
func (c *compiler) resolveRefs(root *node) *node {
	r := &refResolver{c: c, root: root, memo: map[*node]*node{}, refs: map[string]*node{}, active: map[string]bool{}}
	return r.walk(root)
}

type refResolver struct {
	c      *compiler
	root   *node
	memo   map[*node]*node
	refs   map[string]*node // resolved value per reference path
	active map[string]bool  // references being resolved, for cycles
}

func refPath(n *node) []string {
	p := make([]string, len(n.seq))
	for i, s := range n.seq {
		p[i] = s.str
	}
	return p
}

// walk returns n with its references resolved; nil for a reference
// left out because its target may be in an include that did not load.
func (r *refResolver) walk(n *node) *node {
	if n == nil {
		return nil
	}
	if v, ok := r.memo[n]; ok {
		return v
	}
	var out *node
	switch n.kind {
	case kRef:
		out = r.deref(n)
	case kMap:
		changed := false
		m := make([]entry, 0, len(n.m))
		for _, e := range n.m {
			v := r.walk(e.val)
			changed = changed || v != e.val
			if v == nil {
				continue // a reference into a file that did not load
			}
			e.val = v
			m = append(m, e)
		}
		out = n
		if changed {
			c := *n
			c.m = m
			out = &c
		}
	case kSeq:
		changed := false
		s := make([]*node, 0, len(n.seq))
		for _, e := range n.seq {
			v := r.walk(e)
			changed = changed || v != e
			if v != nil {
				s = append(s, v)
			}
		}
		out = n
		if changed {
			c := *n
			c.seq = s
			out = &c
		}
	default:
		out = n
	}
	r.memo[n] = out
	return out
}

func (r *refResolver) deref(n *node) *node {
	path := refPath(n)
	show := "!reference [" + strings.Join(path, ", ") + "]"
	key := strings.Join(path, "\x00")
	if v, ok := r.refs[key]; ok {
		return v
	}
	if r.active[key] {
		r.c.d.errorf(n.pos, "%s: circular references detected", show)
		return &node{kind: kNull, pos: n.pos}
	}
	if len(r.active) >= maxReferenceDepth {
		r.c.d.errorf(n.pos, "%s: too many nested references (more than %d)", show, maxReferenceDepth)
		return &node{kind: kNull, pos: n.pos}
	}
	cur := r.root
	for _, k := range path {
		if cur.kind != kMap {
			cur = nil
			break
		}
		cur = cur.get(k)
		if cur == nil {
			break
		}
	}
	if cur == nil {
		if r.c.incomplete {
			// The target may be in an include that did not load: the
			// reference is left out (nil), as if not written, so what
			// holds it is checked without it rather than as a null.
			return nil
		}
		r.c.d.errorf(n.pos, "%s could not be found", show)
		return &node{kind: kNull, pos: n.pos}
	}
	r.active[key] = true
	v := r.walk(cur)
	delete(r.active, key)
	r.refs[key] = v
	return v
}
