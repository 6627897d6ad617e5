package ci

import (
	"strings"
	"time"
)

type ruleKind int

const (
	ruleJob ruleKind = iota
	ruleWorkflow
	ruleInclude
)

type rule struct {
	pos          Pos
	ifExpr       *Expression
	changes      *ChangesQuery
	exists       []string
	when         When
	whenSet      bool
	allowFailure *bool
	variables    []Variable
	startIn      time.Duration
	startInSet   bool
	interrupt    *bool
	onlyWhen     bool // the rule has when and nothing else
	// needs replaces the job's needs when the rule matches (rules:needs).
	needs    []needSpec
	needsSet bool
	// existsProject and existsRef: exists looks at another project's
	// files (rules:exists:project, GitLab 16.4), at existsRef (default:
	// its default branch).
	existsProject, existsRef string
}

// rules parses a rules list. Nested lists (from !reference) are flattened.
func (c *compiler) rules(n *node, at string, kind ruleKind) []*rule {
	if n.kind != kSeq {
		c.d.errorf(n.pos, "%s should be a list of rules, found %s", at, n.describe())
		return nil
	}
	if len(n.seq) == 0 && kind != ruleInclude {
		// GitLab validates the list's presence (Entry::Rules).
		c.d.errorf(n.pos, "%s config can't be blank", at)
		return nil
	}
	out := []*rule{}
	var walk func(n *node, depth int)
	walk = func(n *node, depth int) {
		for _, x := range n.seq {
			if x.kind == kSeq && depth < 10 {
				walk(x, depth+1)
				continue
			}
			if r := c.rule(x, at, kind); r != nil {
				out = append(out, r)
			}
		}
	}
	walk(n, 0)
	return out
}

func (c *compiler) rule(n *node, at string, kind ruleKind) *rule {
	if n.kind != kMap {
		c.d.errorf(n.pos, "%s: each rule should be a mapping (like - if: ...), found %s", at, n.describe())
		return nil
	}
	if len(n.m) == 0 {
		// GitLab validates each rule's presence (Entry::Rules::Rule).
		c.d.errorf(n.pos, "%s:rule config can't be blank", at)
		return nil
	}
	r := &rule{pos: n.pos}
	var whens []string
	switch kind {
	case ruleJob:
		c.checkKeys(n, at, "if", "changes", "exists", "when", "allow_failure", "variables", "start_in", "interruptible", "needs")
		whens = []string{"on_success", "on_failure", "always", "never", "manual", "delayed"}
	case ruleWorkflow:
		// GitLab also accepts allow_failure and needs here, and ignores
		// them (gitlab-org/gitlab#436473: kept not to break files).
		c.checkKeys(n, at, "if", "changes", "exists", "when", "variables", "auto_cancel", "allow_failure", "needs")
		whens = []string{"always", "never"}
	case ruleInclude:
		c.checkKeys(n, at, "if", "changes", "exists", "when")
		whens = []string{"always", "never"}
	}
	r.onlyWhen = len(n.m) == 1 && n.get("when") != nil
	for _, e := range n.m {
		switch e.key {
		case "if":
			s, ok := c.str(e.val, at+":if")
			if !ok {
				continue
			}
			x, err := ParseExpression(s)
			if err != nil {
				c.d.errorf(e.val.pos, "%s: invalid expression %q: %v", at+":if", s, err)
				continue
			}
			r.ifExpr = x
		case "changes":
			r.changes = c.changes(e.val, at+":changes")
		case "exists":
			r.exists = c.exists(e.val, at+":exists")
			if e.val.kind == kMap {
				if x := e.val.get("project"); x != nil {
					r.existsProject, _ = c.str(x, at+":exists:project")
				}
				if x := e.val.get("ref"); x != nil {
					r.existsRef, _ = c.str(x, at+":exists:ref")
					if r.existsProject == "" {
						c.d.errorf(x.pos, "%s:exists:ref needs exists:project", at)
					}
				}
			}
		case "when":
			w, ok := c.oneOf(e.val, at+":when", whens...)
			if ok {
				r.when, r.whenSet = When(w), true
			}
		case "allow_failure":
			if b, ok := c.boolean(e.val, at+":allow_failure"); ok {
				r.allowFailure = &b
				if kind == ruleWorkflow {
					c.d.warnf(e.keyPos, "%s:allow_failure is ignored: a pipeline's rules do not make jobs allowed to fail (GitLab ignores it too)", at)
				}
			}
		case "interruptible":
			if b, ok := c.boolean(e.val, at+":interruptible"); ok {
				r.interrupt = &b
			}
		case "variables":
			r.variables = c.simpleVariables(e.val, at+":variables")
			c.checkIsolationVars(e.val, at+":variables")
		case "start_in":
			if d, ok := c.duration(e.val, at+":start_in", 7*24*time.Hour); ok {
				r.startIn, r.startInSet = d, true
			}
		case "needs":
			if kind == ruleInclude {
				continue // an unknown keyword there, reported by checkKeys
			}
			if kind == ruleWorkflow {
				c.needs(e.val, at+":needs") // checked as GitLab checks it
				c.d.warnf(e.keyPos, "%s:needs is ignored: a pipeline's rules do not set jobs' needs (GitLab ignores it too)", at)
				continue
			}
			r.needsSet = true
			for _, nd := range c.needs(e.val, at+":needs") {
				if nd.cross != nil {
					c.d.errorf(nd.pos, "%s:needs: needs on other pipelines or projects go on the job, not in rules", at)
					continue
				}
				r.needs = append(r.needs, nd)
			}
		case "auto_cancel":
			c.d.warnf(e.keyPos, "%s:auto_cancel is ignored: Berth does not auto-cancel pipelines", at)
		}
	}
	if kind == ruleJob {
		if r.when == Delayed && !r.startInSet && n.get("start_in") == nil {
			c.d.errorf(n.pos, "%s: when: delayed needs start_in", at)
		}
		if r.when != Delayed && n.get("start_in") != nil {
			c.d.errorf(n.entry("start_in").keyPos, "%s: start_in is only allowed with when: delayed", at)
		}
	}
	return r
}

func (c *compiler) changes(n *node, at string) *ChangesQuery {
	q := &ChangesQuery{}
	switch n.kind {
	case kSeq:
		q.Paths, _ = c.strList(n, at, false, true)
	case kMap:
		c.checkKeys(n, at, "paths", "compare_to")
		if x := n.get("paths"); x != nil {
			q.Paths, _ = c.strList(x, at+":paths", false, true)
		} else {
			c.d.errorf(n.pos, "%s: paths is required", at)
		}
		if x := n.get("compare_to"); x != nil {
			q.CompareTo, _ = c.str(x, at+":compare_to")
		}
	default:
		c.d.errorf(n.pos, "%s should be a list of paths or a mapping with paths, found %s", at, n.describe())
		return nil
	}
	if len(q.Paths) > 50 {
		c.d.errorf(n.pos, "%s: at most 50 paths, found %d", at, len(q.Paths))
	}
	return q
}

func (c *compiler) exists(n *node, at string) []string {
	switch n.kind {
	case kSeq, kScalar:
		p, _ := c.strList(n, at, true, true)
		if p == nil {
			p = []string{}
		}
		return p
	case kMap:
		c.checkKeys(n, at, "paths", "project", "ref")
		p, _ := c.strList(n.get("paths"), at+":paths", false, true)
		if n.get("paths") == nil {
			c.d.errorf(n.pos, "%s: paths is required", at)
		}
		if p == nil {
			p = []string{}
		}
		return p
	}
	c.d.errorf(n.pos, "%s should be a list of paths, found %s", at, n.describe())
	return nil
}

// matchRule reports whether every clause of a rule holds. I/O errors of
// the caller's Changes and Exists functions end compilation.
func (c *compiler) matchRule(r *rule, vars map[string]string) bool {
	if c.ioErr != nil {
		return false
	}
	if r.ifExpr != nil && !r.ifExpr.Eval(vars) {
		return false
	}
	if r.changes != nil && !c.changed(r.changes, vars, "rules:changes at "+r.pos.String()) {
		return false
	}
	if r.exists != nil {
		var pats []string
		for _, p := range r.exists {
			pats = append(pats, expandVars(p, vars))
		}
		var (
			ok  bool
			err error
		)
		switch {
		case r.existsProject != "":
			if c.env.ExistsIn == nil {
				return false
			}
			ok, err = c.env.ExistsIn(c.ctx, expandVars(r.existsProject, vars), expandVars(r.existsRef, vars), pats)
		case c.env.Exists == nil:
			return false
		default:
			ok, err = c.env.Exists(c.ctx, pats)
		}
		if err != nil {
			c.ioErr = wrapf(err, "evaluating rules:exists at %s", r.pos)
			return false
		}
		if !ok {
			return false
		}
	}
	return true
}

// changed answers a changes clause (rules' or only/except's), variables
// expanded: true when a path changed, or when there is no diff to look
// at (Env.Changes nil), as in GitLab. An error of Env.Changes ends
// compilation (what names the clause in it).
func (c *compiler) changed(q *ChangesQuery, vars map[string]string, what string) bool {
	if c.env.Changes == nil {
		return true
	}
	x := ChangesQuery{CompareTo: expandVars(q.CompareTo, vars)}
	for _, p := range q.Paths {
		x.Paths = append(x.Paths, expandVars(p, vars))
	}
	ok, err := c.env.Changes(c.ctx, x)
	if err != nil {
		c.ioErr = wrapf(err, "evaluating %s", what)
		return false
	}
	return ok
}

// firstMatch returns the index of the first matching rule, or -1.
func (c *compiler) firstMatch(rs []*rule, vars map[string]string) int {
	for i, r := range rs {
		if c.matchRule(r, vars) {
			return i
		}
	}
	return -1
}

// includeRulesMatch evaluates include:rules with the caller's variables.
func (c *compiler) includeRulesMatch(n *node) (bool, error) {
	rs := c.rules(n, "include:rules", ruleInclude)
	i := c.firstMatch(rs, c.baseVars)
	if c.ioErr != nil {
		return false, c.ioErr
	}
	if i < 0 {
		return false, nil
	}
	return !rs[i].whenSet || rs[i].when != Never, nil
}

// expandVars expands $VAR and ${VAR}; unknown variables expand to "".
func expandVars(s string, vars map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		if s[i+1] == '$' {
			b.WriteByte('$')
			i++
			continue
		}
		if s[i+1] == '{' {
			end := strings.IndexByte(s[i+2:], '}')
			if end >= 0 {
				b.WriteString(vars[s[i+2:i+2+end]])
				i += end + 2
				continue
			}
		}
		j := i + 1
		for j < len(s) && isWordByte(s[j]) {
			j++
		}
		if j == i+1 {
			b.WriteByte('$')
			continue
		}
		b.WriteString(vars[s[i+1:j]])
		i = j - 1
	}
	return b.String()
}
