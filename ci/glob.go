package ci

import (
	"strings"
	"unicode/utf8"
)

// MatchGlob reports whether a repository path matches a pattern of
// rules:changes or rules:exists, with the semantics GitLab gets from Ruby's
// File.fnmatch? with FNM_PATHNAME, FNM_DOTMATCH and FNM_EXTGLOB:
//
//	"*"      any run of characters except /
//	"**/"    zero or more whole directories
//	"?"      one character except /
//	"[a-z]"  a character class ([!a-z] or [^a-z] negated)
//	"{a,b}"  alternatives
//	"\x"     x literally
//
// Dot files are matched like any other file. ChangesFunc and ExistsFunc
// implementations should use it so that patterns mean what they mean in
// GitLab.
func MatchGlob(pattern, name string) bool { return matchGlob(pattern, name, false) }

// matchGlob matches with MatchGlob's syntax. With crossDirs, a ** that is not
// followed by / also matches across directories, as GitLab documents for
// include:local wildcards (configs/**.yml).
func matchGlob(pattern, name string, crossDirs bool) bool {
	alts := expandBraces(pattern, 256)
	for _, p := range alts {
		m := &globMatcher{p: p, s: name, cross: crossDirs, memo: map[[2]int]bool{}}
		if m.match(0, 0) {
			return true
		}
	}
	return false
}

// expandBraces expands {a,b} alternatives, at most max results.
func expandBraces(p string, max int) []string {
	start, depth := -1, 0
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '\\':
			i++
		case '{':
			if depth == 0 {
				start = i
			}
			depth++
		case '}':
			if depth == 0 {
				continue
			}
			depth--
			if depth == 0 {
				var parts []string
				last, d := start+1, 0
				for j := start + 1; j < i; j++ {
					switch p[j] {
					case '\\':
						j++
					case '{':
						d++
					case '}':
						d--
					case ',':
						if d == 0 {
							parts = append(parts, p[last:j])
							last = j + 1
						}
					}
				}
				parts = append(parts, p[last:i])
				var out []string
				for _, part := range parts {
					for _, rest := range expandBraces(part+p[i+1:], max) {
						out = append(out, p[:start]+rest)
						if len(out) >= max {
							return out
						}
					}
				}
				return out
			}
		}
	}
	return []string{p}
}

type globMatcher struct {
	p, s  string
	cross bool
	memo  map[[2]int]bool
}

func (m *globMatcher) match(pi, si int) bool {
	key := [2]int{pi, si}
	if v, ok := m.memo[key]; ok {
		return v
	}
	v := m.matchUncached(pi, si)
	m.memo[key] = v
	return v
}

func (m *globMatcher) matchUncached(pi, si int) bool {
	p, s := m.p, m.s
	if pi == len(p) {
		return si == len(s)
	}
	switch {
	case strings.HasPrefix(p[pi:], "**/") && (pi == 0 || p[pi-1] == '/'):
		// zero or more directories
		if m.match(pi+3, si) {
			return true
		}
		for i := si; i < len(s); i++ {
			if s[i] == '/' && m.match(pi+3, i+1) {
				return true
			}
		}
		return false
	case strings.HasPrefix(p[pi:], "**") && m.cross:
		for i := si; i <= len(s); i++ {
			if m.match(pi+2, i) {
				return true
			}
		}
		return false
	case p[pi] == '*':
		for i := si; i <= len(s); i++ {
			if m.match(pi+1, i) {
				return true
			}
			if i < len(s) && s[i] == '/' {
				break
			}
		}
		return false
	}
	if si == len(s) {
		return false
	}
	r, rn := utf8.DecodeRuneInString(s[si:])
	switch p[pi] {
	case '?':
		return r != '/' && m.match(pi+1, si+rn)
	case '[':
		ok, next, valid := matchClass(p, pi, r)
		if !valid {
			return r == '[' && m.match(pi+1, si+rn)
		}
		return ok && r != '/' && m.match(next, si+rn)
	case '\\':
		if pi+1 < len(p) {
			pr, pn := utf8.DecodeRuneInString(p[pi+1:])
			return pr == r && m.match(pi+1+pn, si+rn)
		}
	}
	pr, pn := utf8.DecodeRuneInString(p[pi:])
	return pr == r && m.match(pi+pn, si+rn)
}

// matchClass matches r against the class starting at p[i] == '['. It
// returns the index after the class; valid is false for an unterminated
// class, which then matches a literal '['.
func matchClass(p string, i int, r rune) (ok bool, next int, valid bool) {
	j := i + 1
	neg := false
	if j < len(p) && (p[j] == '!' || p[j] == '^') {
		neg = true
		j++
	}
	first := true
	for j < len(p) {
		if p[j] == ']' && !first {
			return ok != neg, j + 1, true
		}
		first = false
		lo, n := utf8.DecodeRuneInString(p[j:])
		if lo == '\\' && j+1 < len(p) {
			j++
			lo, n = utf8.DecodeRuneInString(p[j:])
		}
		j += n
		hi := lo
		if j+1 < len(p) && p[j] == '-' && p[j+1] != ']' {
			h, hn := utf8.DecodeRuneInString(p[j+1:])
			hi = h
			j += 1 + hn
		}
		if lo <= r && r <= hi {
			ok = true
		}
	}
	return false, 0, false
}

// ChangesMatch reports whether any of files matches one of rules:changes'
// paths (a leading / is the repository's root).
func ChangesMatch(paths, files []string) bool {
	for _, f := range files {
		for _, p := range paths {
			if MatchGlob(strings.TrimPrefix(p, "/"), f) {
				return true
			}
		}
	}
	return false
}
