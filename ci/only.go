package ci

import (
	"regexp"
	"slices"
	"strings"
)

// only and except: GitLab's older job filters, kept for the files that
// still use them. Each is a list of refs, or a mapping of refs,
// variables, changes and kubernetes. A job is in the pipeline when every
// keyword of its only matches (if set) and no keyword of its except does
// (if set: each keyword excludes on its own, as GitLab's policies do); a
// job with except and no only gets only: [branches, tags], as in GitLab.
// A keyword matches when refs: any pattern; variables: any expression;
// changes: any path changed; kubernetes: active. rules and only/except
// cannot be mixed.

// refKeywords are the words only/except:refs give a meaning to, with the
// pipeline source each stands for ("" for branches and tags, which look
// at the ref).
var refKeywords = map[string]string{
	"branches": "", "tags": "",
	"api": "api", "chat": "chat", "external": "external", "external_pull_requests": "external_pull_request_event",
	"merge_requests": "merge_request_event", "pipelines": "pipeline", "pushes": "push", "schedules": "schedule",
	"triggers": "trigger", "web": "web",
}

// refPattern is one entry of only/except:refs.
type refPattern struct {
	keyword string         // one of refKeywords, or ""
	re      *regexp.Regexp // a /regexp/ on the ref's name
	name    string         // else the ref's name itself
	project string         // after @: the project's path must be this
}

// onlySpec is a job's only: or except:.
type onlySpec struct {
	refs       []refPattern // nil: no refs clause
	variables  []*Expression
	changes    *ChangesQuery
	kubernetes bool
}

// defaultOnly is what a job without only gets, unless it or the workflow
// has rules.
var defaultOnly = &onlySpec{refs: []refPattern{{keyword: "branches"}, {keyword: "tags"}}}

// onlyExcept parses only: or except: (at names it in errors).
func (c *compiler) onlyExcept(n *node, at string) *onlySpec {
	s := &onlySpec{}
	switch n.kind {
	case kScalar, kSeq:
		s.refs = c.refPatterns(n, at)
	case kMap:
		c.checkKeys(n, at, "refs", "variables", "changes", "kubernetes")
		if x := n.get("refs"); x != nil {
			s.refs = c.refPatterns(x, at+":refs")
		}
		if x := n.get("variables"); x != nil {
			exprs, _ := c.strList(x, at+":variables", false, true)
			for _, src := range exprs {
				e, err := ParseExpression(src)
				if err != nil {
					c.d.errorf(x.pos, "%s:variables: invalid expression %q: %v", at, src, err)
					continue
				}
				s.variables = append(s.variables, e)
			}
			if s.variables == nil {
				s.variables = []*Expression{}
			}
		}
		if x := n.get("changes"); x != nil {
			s.changes = c.changes(x, at+":changes")
		}
		if x := n.get("kubernetes"); x != nil {
			if v, ok := c.str(x, at+":kubernetes"); ok && v != "active" {
				c.d.errorf(x.pos, "%s:kubernetes should be active, found %q", at, v)
			}
			s.kubernetes = true
		}
	default:
		c.d.errorf(n.pos, "%s should be a list of refs or a mapping of refs, variables, changes and kubernetes, found %s", at, n.describe())
		return nil
	}
	return s
}

// refPatterns parses a list (or one string) of ref patterns.
func (c *compiler) refPatterns(n *node, at string) []refPattern {
	list, ok := c.strList(n, at, true, true)
	if !ok {
		return nil
	}
	out := []refPattern{}
	for _, raw := range list {
		p := refPattern{}
		pat := raw
		if i := strings.IndexByte(raw, '@'); i >= 0 {
			pat, p.project = raw[:i], raw[i+1:]
		}
		switch {
		case refKeywordOK(pat):
			p.keyword = pat
		case len(pat) >= 2 && pat[0] == '/' && strings.LastIndexByte(pat, '/') > 0:
			re, err := rubyRegexp(pat)
			if err != nil {
				c.d.errorf(n.pos, "%s: %q is not a valid regular expression: %v", at, raw, err)
				continue
			}
			p.re = re
		default:
			p.name = pat
		}
		out = append(out, p)
	}
	return out
}

func refKeywordOK(s string) bool { _, ok := refKeywords[s]; return ok }

// rubyRegexp compiles /pattern/flags (flags i and m, as GitLab's
// untrusted regexps take them; m lets . match newlines).
func rubyRegexp(s string) (*regexp.Regexp, error) {
	end := strings.LastIndexByte(s, '/')
	body, flags := s[1:end], s[end+1:]
	prefix := ""
	for _, f := range flags {
		switch f {
		case 'i':
			prefix += "i"
		case 'm':
			prefix += "s"
		default:
			return nil, errBadFlag(f)
		}
	}
	if prefix != "" {
		body = "(?" + prefix + ")" + body
	}
	return regexp.Compile(body)
}

type errBadFlag rune

func (e errBadFlag) Error() string { return "unknown flag " + string(rune(e)) + " (allowed: i, m)" }

// matchOnly reports whether every keyword of an only: matches the
// pipeline (GitLab's all_of_only?).
func (c *compiler) matchOnly(s *onlySpec, vars map[string]string) bool {
	return c.matchKeywords(s, vars, true)
}

// matchExcept reports whether any keyword of an except: matches the
// pipeline, which leaves the job out (GitLab's none_of_except?: each
// keyword is a policy of its own).
func (c *compiler) matchExcept(s *onlySpec, vars map[string]string) bool {
	return c.matchKeywords(s, vars, false)
}

// matchKeywords evaluates the keywords s has, in order, until one
// settles the answer: for all (only:), a keyword that does not match; for
// any (except:), one that does.
func (c *compiler) matchKeywords(s *onlySpec, vars map[string]string, all bool) bool {
	settles := func(present bool, matches func() bool) bool { return present && matches() != all }
	switch {
	case settles(s.refs != nil, func() bool {
		return slices.ContainsFunc(s.refs, func(p refPattern) bool { return p.matches(vars) })
	}),
		settles(s.variables != nil, func() bool {
			return slices.ContainsFunc(s.variables, func(e *Expression) bool { return e.Eval(vars) })
		}),
		settles(s.changes != nil, func() bool { return c.changed(s.changes, vars, "only/except:changes") }),
		// Berth has no Kubernetes integration: it is never active.
		settles(s.kubernetes, func() bool { return false }):
		return !all
	}
	return all
}

// matches reports whether the pipeline's ref and source match p.
func (p refPattern) matches(vars map[string]string) bool {
	if p.project != "" && vars["CI_PROJECT_PATH"] != p.project {
		return false
	}
	ref := vars["CI_COMMIT_REF_NAME"]
	switch {
	case p.keyword == "branches":
		// GitLab's branch?: neither a tag nor a merge request pipeline.
		src := vars["CI_PIPELINE_SOURCE"]
		return vars["CI_COMMIT_TAG"] == "" && src != "merge_request_event" && src != "external_pull_request_event"
	case p.keyword == "tags":
		return vars["CI_COMMIT_TAG"] != ""
	case p.keyword != "":
		return vars["CI_PIPELINE_SOURCE"] == refKeywords[p.keyword]
	case p.re != nil:
		return p.re.MatchString(ref)
	}
	return ref == p.name
}
