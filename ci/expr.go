package ci

import (
	"fmt"
	"regexp"
	"strings"
)

// Expression is a parsed rules:if expression. The language is GitLab's:
//
//	$VAR                      a variable (its value, or null when undefined)
//	"text" 'text'             string literals (no escapes)
//	/regexp/flags             an RE2 pattern, flags from i, s, m, U
//	null true false           literals
//	== != =~ !~               comparison and matching (bind tightest)
//	&&                        and (binds tighter than ||)
//	||                        or
//	( )                       grouping
//
// Evaluation follows GitLab's Ruby implementation: && and || return one of
// their operands, and the result is true when it is "present" (not null,
// not false, not a blank string). A variable on the right of =~ whose value
// is not a /pattern/ matches when the left side is a substring of it, as in
// GitLab.
type Expression struct {
	src  string
	root exprNode
}

// String returns the source text.
func (e *Expression) String() string { return e.src }

const maxExprTokens = 100

type tokKind int

const (
	tParenOpen tokKind = iota
	tParenClose
	tVar
	tString
	tPattern
	tNull
	tBool
	tEq
	tMatch
	tNotEq
	tNotMatch
	tAnd
	tOr
)

type token struct {
	kind tokKind
	text string // variable name, string contents, pattern source
	re   *regexp.Regexp
	b    bool
	off  int
}

// ExprError is a syntax error in an expression, with the byte offset.
type ExprError struct {
	Offset int
	Msg    string
}

func (e *ExprError) Error() string { return e.Msg }

func isWordByte(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func lexExpr(s string) ([]token, error) {
	var toks []token
	i := 0
	for {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f' || s[i] == '\v') {
			i++
		}
		if i == len(s) {
			return toks, nil
		}
		if len(toks) == maxExprTokens {
			return nil, &ExprError{i, fmt.Sprintf("too many tokens (more than %d)", maxExprTokens)}
		}
		start := i
		rest := s[i:]
		switch {
		case rest[0] == '(':
			toks = append(toks, token{kind: tParenOpen, off: start})
			i++
		case rest[0] == ')':
			toks = append(toks, token{kind: tParenClose, off: start})
			i++
		case strings.HasPrefix(rest, "$[["):
			return nil, &ExprError{start, "inputs ($[[ inputs.NAME ]]) are not supported"}
		case rest[0] == '$':
			j := 1
			for j < len(rest) && isWordByte(rest[j]) {
				j++
			}
			if j == 1 {
				return nil, &ExprError{start, "unknown token at " + quoteShort(rest)}
			}
			toks = append(toks, token{kind: tVar, text: rest[1:j], off: start})
			i += j
		case rest[0] == '"' || rest[0] == '\'':
			end := strings.IndexByte(rest[1:], rest[0])
			if end < 0 {
				return nil, &ExprError{start, "unterminated string"}
			}
			toks = append(toks, token{kind: tString, text: rest[1 : 1+end], off: start})
			i += end + 2
		case rest[0] == '/':
			j := 1
			for j < len(rest) && rest[j] != '/' {
				if rest[j] == '\\' && j+1 < len(rest) {
					j++
				}
				j++
			}
			if j >= len(rest) || j == 1 {
				return nil, &ExprError{start, "unterminated regular expression"}
			}
			k := j + 1
			for k < len(rest) && strings.IndexByte("ismU", rest[k]) >= 0 {
				k++
			}
			src := rest[:k]
			re, err := compilePattern(src)
			if err != nil {
				return nil, &ExprError{start, err.Error()}
			}
			toks = append(toks, token{kind: tPattern, text: src, re: re, off: start})
			i += k
		case strings.HasPrefix(rest, "null"):
			toks = append(toks, token{kind: tNull, off: start})
			i += 4
		case strings.HasPrefix(rest, "true"):
			toks = append(toks, token{kind: tBool, b: true, off: start})
			i += 4
		case strings.HasPrefix(rest, "false"):
			toks = append(toks, token{kind: tBool, off: start})
			i += 5
		case strings.HasPrefix(rest, "=="):
			toks = append(toks, token{kind: tEq, off: start})
			i += 2
		case strings.HasPrefix(rest, "=~"):
			toks = append(toks, token{kind: tMatch, off: start})
			i += 2
		case strings.HasPrefix(rest, "!="):
			toks = append(toks, token{kind: tNotEq, off: start})
			i += 2
		case strings.HasPrefix(rest, "!~"):
			toks = append(toks, token{kind: tNotMatch, off: start})
			i += 2
		case strings.HasPrefix(rest, "&&"):
			toks = append(toks, token{kind: tAnd, off: start})
			i += 2
		case strings.HasPrefix(rest, "||"):
			toks = append(toks, token{kind: tOr, off: start})
			i += 2
		default:
			return nil, &ExprError{start, "unknown token at " + quoteShort(rest)}
		}
	}
}

func quoteShort(s string) string {
	if len(s) > 20 {
		s = s[:20] + "…"
	}
	return fmt.Sprintf("%q", s)
}

var patternRe = regexp.MustCompile(`^/(.*)/([ismU]*)$`)

// compilePattern compiles a GitLab /pattern/flags string (with \/ for a
// slash) as RE2, which GitLab also uses.
func compilePattern(src string) (*regexp.Regexp, error) {
	m := patternRe.FindStringSubmatch(strings.ReplaceAll(src, `\/`, `/`))
	if m == nil {
		return nil, fmt.Errorf("invalid regular expression %s", src)
	}
	expr := m[1]
	if m[2] != "" {
		expr = "(?" + dedupFlags(m[2]) + ")" + expr
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("invalid regular expression %s: %v", src, strings.TrimPrefix(err.Error(), "error parsing regexp: "))
	}
	return re, nil
}

func dedupFlags(f string) string {
	var b strings.Builder
	for _, c := range f {
		if !strings.ContainsRune(b.String(), c) {
			b.WriteRune(c)
		}
	}
	return b.String()
}

type exprNode interface {
	eval(sc scope) value
}

// scope is what an expression's variables are: strings, and in the
// conditions of spec:inputs:rules the booleans of boolean inputs, typed
// as GitLab's Input lexeme gives them ($[[ inputs.publish ]] == true).
type scope struct {
	vars  map[string]string
	bools map[string]bool
}

type valueKind int

const (
	vNil valueKind = iota
	vStr
	vBool
	vRegex
)

type value struct {
	kind valueKind
	s    string
	b    bool
	re   *regexp.Regexp
}

func (v value) truthy() bool { return !(v.kind == vNil || v.kind == vBool && !v.b) }

// present is Ruby's Object#present?.
func (v value) present() bool {
	switch v.kind {
	case vNil:
		return false
	case vBool:
		return v.b
	case vStr:
		return strings.TrimSpace(v.s) != ""
	}
	return true
}

func (v value) rubyString() string {
	switch v.kind {
	case vStr:
		return v.s
	case vBool:
		if v.b {
			return "true"
		}
		return "false"
	case vRegex:
		return v.re.String()
	}
	return ""
}

func (v value) equal(w value) bool {
	if v.kind != w.kind {
		return false
	}
	switch v.kind {
	case vNil:
		return true
	case vStr:
		return v.s == w.s
	case vBool:
		return v.b == w.b
	}
	return v.re.String() == w.re.String()
}

type leaf struct{ t token }

func (l leaf) eval(sc scope) value {
	switch l.t.kind {
	case tVar:
		if b, ok := sc.bools[l.t.text]; ok {
			return value{kind: vBool, b: b}
		}
		if s, ok := sc.vars[l.t.text]; ok {
			return value{kind: vStr, s: s}
		}
		return value{}
	case tString:
		return value{kind: vStr, s: l.t.text}
	case tPattern:
		return value{kind: vRegex, re: l.t.re}
	case tBool:
		return value{kind: vBool, b: l.t.b}
	}
	return value{}
}

type binary struct {
	op          tokKind
	left, right exprNode
}

func (b binary) eval(sc scope) value {
	switch b.op {
	case tAnd:
		l := b.left.eval(sc)
		if !l.truthy() {
			return l
		}
		return b.right.eval(sc)
	case tOr:
		l := b.left.eval(sc)
		if l.truthy() {
			return l
		}
		return b.right.eval(sc)
	case tEq:
		return boolValue(b.left.eval(sc).equal(b.right.eval(sc)))
	case tNotEq:
		return boolValue(!b.left.eval(sc).equal(b.right.eval(sc)))
	case tMatch, tNotMatch:
		text := b.left.eval(sc).rubyString()
		r := b.right.eval(sc)
		if !r.truthy() {
			return boolValue(b.op == tNotMatch)
		}
		var m bool
		switch r.kind {
		case vRegex:
			m = r.re.MatchString(text)
		case vStr:
			if re, err := compilePattern(r.s); err == nil && strings.HasPrefix(r.s, "/") {
				m = re.MatchString(text)
			} else {
				// GitLab falls back to String#scan on the variable's
				// value: true when the left side occurs in it.
				m = strings.Contains(r.s, text)
			}
		default:
			m = strings.Contains(r.rubyString(), text)
		}
		return boolValue(m != (b.op == tNotMatch))
	}
	return value{}
}

func boolValue(b bool) value { return value{kind: vBool, b: b} }

// ParseExpression parses a rules:if expression.
func ParseExpression(src string) (*Expression, error) {
	toks, err := lexExpr(src)
	if err != nil {
		return nil, err
	}
	if len(toks) == 0 {
		return nil, &ExprError{0, "empty expression"}
	}
	p := &exprParser{toks: toks}
	n, err := p.or()
	if err != nil {
		return nil, err
	}
	if p.i < len(toks) {
		return nil, &ExprError{toks[p.i].off, "unexpected " + tokName(toks[p.i])}
	}
	return &Expression{src: src, root: n}, nil
}

// Eval evaluates the expression against variables (undefined variables
// are null).
func (e *Expression) Eval(vars map[string]string) bool {
	return e.root.eval(scope{vars: vars}).present()
}

// evalTyped is Eval where the variables named in bools are booleans.
func (e *Expression) evalTyped(vars map[string]string, bools map[string]bool) bool {
	return e.root.eval(scope{vars: vars, bools: bools}).present()
}

type exprParser struct {
	toks []token
	i    int
}

func (p *exprParser) peek() (token, bool) {
	if p.i < len(p.toks) {
		return p.toks[p.i], true
	}
	return token{}, false
}

func (p *exprParser) or() (exprNode, error) {
	l, err := p.and()
	if err != nil {
		return nil, err
	}
	for {
		t, ok := p.peek()
		if !ok || t.kind != tOr {
			return l, nil
		}
		p.i++
		r, err := p.and()
		if err != nil {
			return nil, err
		}
		l = binary{op: tOr, left: l, right: r}
	}
}

func (p *exprParser) and() (exprNode, error) {
	l, err := p.cmp()
	if err != nil {
		return nil, err
	}
	for {
		t, ok := p.peek()
		if !ok || t.kind != tAnd {
			return l, nil
		}
		p.i++
		r, err := p.cmp()
		if err != nil {
			return nil, err
		}
		l = binary{op: tAnd, left: l, right: r}
	}
}

func (p *exprParser) cmp() (exprNode, error) {
	l, err := p.operand()
	if err != nil {
		return nil, err
	}
	for {
		t, ok := p.peek()
		if !ok || (t.kind != tEq && t.kind != tNotEq && t.kind != tMatch && t.kind != tNotMatch) {
			return l, nil
		}
		p.i++
		r, err := p.operand()
		if err != nil {
			return nil, err
		}
		l = binary{op: t.kind, left: l, right: r}
	}
}

func (p *exprParser) operand() (exprNode, error) {
	t, ok := p.peek()
	if !ok {
		off := 0
		if len(p.toks) > 0 {
			off = p.toks[len(p.toks)-1].off
		}
		return nil, &ExprError{off, "expression ends where a value is expected"}
	}
	switch t.kind {
	case tParenOpen:
		p.i++
		n, err := p.or()
		if err != nil {
			return nil, err
		}
		c, ok := p.peek()
		if !ok || c.kind != tParenClose {
			return nil, &ExprError{t.off, "unbalanced parenthesis"}
		}
		p.i++
		return n, nil
	case tVar, tString, tPattern, tNull, tBool:
		p.i++
		return leaf{t}, nil
	}
	return nil, &ExprError{t.off, "unexpected " + tokName(t)}
}

func tokName(t token) string {
	switch t.kind {
	case tParenOpen:
		return "("
	case tParenClose:
		return ")"
	case tEq:
		return "=="
	case tNotEq:
		return "!="
	case tMatch:
		return "=~"
	case tNotMatch:
		return "!~"
	case tAnd:
		return "&&"
	case tOr:
		return "||"
	}
	return "value"
}
