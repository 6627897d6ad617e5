package ci

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v4"
)

// GitLab's interpolation limits (Gitlab::Ci::Config::Interpolation).
const (
	maxInterpolationBlocks = 10_000 // distinct $[[ ]] blocks in a file
	maxBlockFunctions      = 3      // functions in one block
	maxAccessBytes         = 1024   // the inputs.name part of a block
	maxAccessObjects       = 5      // dot-separated parts kept
)

// blockRe is GitLab's interpolation block: $[[ DATA ]] with DATA at least
// two characters, spaces around it ignored.
var blockRe = regexp.MustCompile(`\$\[\[\s*(\S.*?\S)\s*\]\]`)

var inputTypes = []string{"array", "boolean", "number", "string"}

// inputSpec is one entry of spec:inputs.
type inputSpec struct {
	name       string
	pos        Pos
	typ        string
	def        *node // nil: required
	options    []*node
	optionsPos Pos
	regex      *regexp.Regexp
	// rules (GitLab 18.6's conditional inputs): the first rule whose if
	// matches (or that has none) gives the options and default.
	rules []inputRule
}

// inputRule is one entry of spec:inputs:NAME:rules.
type inputRule struct {
	cond    *Expression // nil: always
	refs    []string    // inputs the condition reads
	pos     Pos
	options []*node
	def     *node
	hasDef  bool
}

// inputArg is one input value given to a file: an entry of include:inputs,
// or a pipeline input from Env.Inputs.
type inputArg struct {
	name string
	pos  Pos
	val  *node
	// text is a pipeline input given as text: it is read as the input's
	// type (a number, true/false, a YAML list).
	text bool
}

// header applies a file's documents' spec: header: it checks the inputs
// given (args) against spec:inputs and interpolates $[[ ]] blocks in the
// configuration. what names the file in messages; at is where the inputs
// were given (the include, or the file itself for pipeline inputs). It
// returns the configuration document; ok is false when the file cannot be
// used.
func (c *compiler) header(docs []*node, file string, args []inputArg, at Pos, what string, comp *componentContext) (*node, bool) {
	var hdr, doc *node
	switch len(docs) {
	case 0:
	case 1:
		doc = docs[0]
		if doc != nil && doc.kind == kMap {
			if e := doc.entry("spec"); e != nil && headerShaped(e.val) {
				c.d.errorf(e.keyPos, "spec: must be a YAML document of its own: write spec:, then a line ---, then the configuration")
				return nil, false
			}
		}
	default:
		hdr, doc = docs[0], docs[1]
		if hdr.isNull() {
			hdr = nil
		}
		if doc.isNull() {
			doc = nil
		}
		switch {
		case hdr != nil && hdr.kind == kMap && hdr.entry("spec") != nil:
		// As GitLab (its loader rejects empty documents, and without a
		// spec: header takes the first document): an empty document
		// before or after the configuration is none, and of two
		// documents without a header the second is ignored, with a
		// warning here.
		case hdr == nil:
		case doc == nil:
			hdr, doc = nil, hdr
		default:
			c.d.warnf(doc.pos, "this second YAML document is ignored, as GitLab ignores it: only a file that starts with a spec: header holds two (the header, then the configuration)")
			hdr, doc = nil, hdr
		}
	}
	if hdr == nil {
		if len(args) > 0 {
			c.d.errorf(at, "%s: Given inputs not defined in the `spec` section of the included configuration file", what)
			return nil, false
		}
		c.blocksWithoutHeader(doc)
		return doc, true
	}
	specs, compKeys, ok := c.parseSpec(hdr)
	if !ok {
		return nil, false
	}
	vals, ok := c.inputValues(specs, args, at, what)
	if !ok {
		return nil, false
	}
	if doc == nil {
		return nil, true
	}
	ip := &interpolator{c: c, inputs: vals, memo: map[*node]*node{}, blocks: map[string]bool{}, component: map[string]string{}}
	if comp != nil {
		// Only what spec:component names, and only in a component.
		all := map[string]string{"name": comp.name, "sha": comp.sha, "version": comp.version, "reference": comp.reference}
		for _, k := range compKeys {
			ip.component[k] = all[k]
		}
	}
	out := ip.node(doc)
	if ip.failed {
		return nil, false
	}
	return out, true
}

// blocksWithoutHeader warns of the first $[[ ]] block in a file without
// a spec: header: GitLab leaves them as text (its Interpolator returns a
// headerless file's content as it is), so Berth does too, and says so.
func (c *compiler) blocksWithoutHeader(doc *node) {
	seen := map[*node]bool{}
	warned := false
	check := func(s string, p Pos) {
		if warned || !strings.Contains(s, "$[[") {
			return
		}
		for _, m := range blockRe.FindAllStringSubmatch(s, -1) {
			if skipInterpolation(m[1]) {
				continue
			}
			c.d.warnf(p, "%s is left as written: interpolation needs a spec:inputs header in this file (spec:, then ---, then the configuration)", m[0])
			warned = true
			return
		}
	}
	var walk func(n *node)
	walk = func(n *node) {
		if n == nil || seen[n] || warned {
			return
		}
		seen[n] = true
		switch n.kind {
		case kScalar:
			if n.tag == "!!str" {
				check(n.str, n.pos)
			}
		case kMap:
			for _, e := range n.m {
				check(e.key, e.keyPos)
				walk(e.val)
			}
		case kSeq:
			for _, x := range n.seq {
				walk(x)
			}
		}
	}
	walk(doc)
}

// skipInterpolation reports blocks GitLab leaves alone: $[[ matrix.X ]]
// belongs to needs:parallel:matrix, not to inputs.
func skipInterpolation(data string) bool {
	access, _, _ := strings.Cut(data, "|")
	first, _, _ := strings.Cut(strings.TrimSpace(access), ".")
	return first == "matrix"
}

// componentKeys are the values spec:component may list (GitLab's
// Header::Component).
var componentKeys = []string{"name", "sha", "version", "reference"}

// parseSpec reads spec:inputs of a header document, and spec:component
// (the component context the file interpolates) and spec:description.
// spec:include stays refused: GitLab's ci_file_inputs flag is off.
func (c *compiler) parseSpec(hdr *node) ([]inputSpec, []string, bool) {
	before := len(c.d.errs)
	c.checkKeys(hdr, "header", "spec")
	spec := hdr.get("spec")
	if spec.isNull() {
		return nil, nil, len(c.d.errs) == before
	}
	if !c.mapping(spec, "spec") {
		return nil, nil, false
	}
	c.checkKeys(spec, "spec", "inputs", "component", "description")
	if d := spec.get("description"); !d.isNull() {
		if desc, ok := c.str(d, "spec:description"); ok && len(desc) > 256 {
			c.d.errorf(d.pos, "spec:description is too long (maximum is 256 characters)")
		}
	}
	var compKeys []string
	if cn := spec.get("component"); !cn.isNull() {
		keys, ok := c.strList(cn, "spec:component", false, false)
		for _, k := range keys {
			if indexOf(componentKeys, k) < 0 {
				c.d.errorf(posOf(cn), "spec:component: unknown value %q (allowed: %s)", k, strings.Join(componentKeys, ", "))
				ok = false
			}
		}
		if ok {
			compKeys = keys
		}
	}
	inputs := spec.get("inputs")
	if inputs.isNull() {
		return nil, compKeys, len(c.d.errs) == before
	}
	if !c.mapping(inputs, "spec:inputs") {
		return nil, nil, false
	}
	var out []inputSpec
	for _, e := range inputs.m {
		s := inputSpec{name: e.key, pos: e.keyPos, typ: "string"}
		at := "spec:inputs:" + e.key
		if e.val.isNull() {
			out = append(out, s)
			continue
		}
		if !c.mapping(e.val, at) {
			continue
		}
		c.checkKeys(e.val, at, "default", "description", "options", "regex", "rules", "type")
		if t := e.val.get("type"); t != nil {
			ts, _ := scalarString(t)
			if t.kind != kScalar || indexOf(inputTypes, ts) < 0 {
				c.d.errorf(posOf(t), "unknown input specification for `%s` (valid types: %s)", e.key, strings.Join(inputTypes, ", "))
				continue
			}
			s.typ = ts
		}
		if d := e.val.entry("default"); d != nil {
			// Having the key makes the input optional. A null default
			// (default: null, or default: with nothing) is an optional
			// input without a value, whatever its type: it interpolates
			// as null where it is a whole value and as "" within text.
			// GitLab's configurations rely on it (GNOME's CI templates,
			// GitLab's documented "entirely optional inputs"); an early
			// GitLab type-checked it and refused it.
			s.def = d.val
			if s.def == nil {
				s.def = &node{kind: kNull, pos: d.keyPos}
			}
		}
		if o := e.val.entry("options"); o != nil {
			s.optionsPos = o.keyPos
			switch {
			case s.typ != "string" && s.typ != "number":
				c.d.errorf(o.keyPos, "`%s` input: Options can only be used with string and number inputs", e.key)
				continue
			case o.val.kind != kSeq || len(o.val.seq) == 0:
				c.d.errorf(posOf(o.val), "%s:options should be a list of values", at)
				continue
			case len(o.val.seq) > maxInputOptions:
				c.d.errorf(posOf(o.val), "%s config cannot define more than %d options", at, maxInputOptions)
				continue
			}
			s.options = o.val.seq
		}
		if r := e.val.entry("regex"); r != nil {
			if s.typ != "string" {
				c.d.errorf(r.keyPos, "`%s` input: RegEx validation can only be used with string inputs", e.key)
				continue
			}
			src, ok := c.str(r.val, at+":regex")
			if !ok {
				continue
			}
			re, err := regexp.Compile(src)
			if err != nil {
				c.d.errorf(posOf(r.val), "`%s` input: invalid regular expression", e.key)
				continue
			}
			s.regex = re
		}
		if desc := e.val.get("description"); desc != nil {
			c.str(desc, at+":description")
		}
		if r := e.val.entry("rules"); r != nil {
			if e.val.entry("default") != nil || e.val.entry("options") != nil {
				c.d.errorf(r.keyPos, "`%s` input: rules cannot be used with default or options; set them in the rules", e.key)
				continue
			}
			rules, ok := c.inputRules(r.val, at+":rules", s.typ)
			if !ok {
				continue
			}
			s.rules = rules
		}
		out = append(out, s)
	}
	return out, compKeys, len(c.d.errs) == before
}

// maxInputOptions is GitLab's limit on an input's options
// (Header::Input::ALLOWED_OPTIONS_LIMIT).
const maxInputOptions = 50

// inputRefRe is an input read in a rules condition.
var inputRefRe = regexp.MustCompile(`\$\[\[\s*inputs\.([A-Za-z0-9_-]+)\s*\]\]`)

// inputRules parses spec:inputs:NAME:rules: a list of {if, options,
// default}. A condition reads other inputs as $[[ inputs.X ]], which are
// turned into variables of the expression, as GitLab's RulesConverter does.
func (c *compiler) inputRules(n *node, at, typ string) ([]inputRule, bool) {
	if n.kind != kSeq || len(n.seq) == 0 {
		c.d.errorf(posOf(n), "%s should be a list of rules", at)
		return nil, false
	}
	var out []inputRule
	ok := true
	for _, x := range n.seq {
		if !c.mapping(x, at) {
			ok = false
			continue
		}
		c.checkKeys(x, at, "if", "options", "default")
		r := inputRule{pos: x.pos}
		if y := x.get("if"); y != nil {
			src, good := c.str(y, at+":if")
			if !good {
				ok = false
				continue
			}
			for _, m := range inputRefRe.FindAllStringSubmatch(src, -1) {
				if indexOf(r.refs, m[1]) < 0 {
					r.refs = append(r.refs, m[1])
				}
			}
			conv := inputRefRe.ReplaceAllStringFunc(src, func(b string) string {
				return "$" + inputVar(inputRefRe.FindStringSubmatch(b)[1])
			})
			e, err := ParseExpression(conv)
			if err != nil {
				c.d.errorf(y.pos, "%s:if: %v", at, err)
				ok = false
				continue
			}
			r.cond = e
		}
		if o := x.entry("options"); o != nil {
			if typ != "string" && typ != "number" {
				c.d.errorf(o.keyPos, "%s:options can only be used with string and number inputs", at)
				ok = false
				continue
			}
			if o.val.kind != kSeq || len(o.val.seq) == 0 {
				c.d.errorf(posOf(o.val), "%s:options should be a list of values", at)
				ok = false
				continue
			}
			if len(o.val.seq) > maxInputOptions {
				c.d.errorf(posOf(o.val), "%s config cannot define more than %d options", at, maxInputOptions)
				ok = false
				continue
			}
			r.options = o.val.seq
		}
		if d := x.entry("default"); d != nil {
			r.def, r.hasDef = d.val, true
		}
		out = append(out, r)
	}
	return out, ok
}

// inputVar is the expression variable standing for an input in a rules
// condition (input names may hold "-", variables may not).
func inputVar(name string) string {
	return "BERTH_INPUT_" + strings.ReplaceAll(name, "-", "__")
}

// inputValues checks the given inputs against the specs, as GitLab's
// Inputs do: unknown inputs, missing required ones, then each default and
// each given value against the type, options and regex.
func (c *compiler) inputValues(specs []inputSpec, args []inputArg, at Pos, what string) (map[string]*node, bool) {
	before := len(c.d.errs)
	byName := map[string]*inputSpec{}
	for i := range specs {
		byName[specs[i].name] = &specs[i]
	}
	given := map[string]inputArg{}
	var unknown []string
	unknownPos := at
	for _, a := range args {
		if _, ok := byName[a.name]; !ok {
			if len(unknown) == 0 {
				unknownPos = a.pos
			}
			unknown = append(unknown, a.name)
			continue
		}
		if a.val.isNull() {
			continue // nil is not provided, as in GitLab
		}
		given[a.name] = a
	}
	if len(unknown) > 0 {
		c.d.errorf(unknownPos, "%s: unknown input arguments: %s", what, strings.Join(unknown, ", "))
	}
	vals := map[string]*node{}
	if !c.applyInputRules(specs, given, at, what) {
		return vals, false
	}
	for i := range specs {
		s := &specs[i]
		a, ok := given[s.name]
		if !ok && s.def == nil {
			c.d.errorf(at, "%s: `%s` input: required value has not been provided", what, s.name)
			continue
		}
		if s.def != nil {
			c.checkInput(s, s.def, true, "")
		}
		if !ok {
			vals[s.name] = canonicalBool(s.def)
			continue
		}
		v := a.val
		if a.text {
			v = textInput(s.typ, v)
		}
		c.checkInput(s, v, false, what+": ")
		vals[s.name] = canonicalBool(v)
	}
	return vals, len(c.d.errs) == before
}

// canonicalBool is v, or when v is a YAML 1.1 boolean written as yes, on,
// no, off (GitLab's parser reads them as true and false) a true/false
// boolean node, so that it interpolates as GitLab's value does.
func canonicalBool(v *node) *node {
	if v == nil || v.kind != kScalar || v.tag == "!!bool" {
		return v
	}
	b, ok := yaml11Bool(v)
	if !ok {
		return v
	}
	return &node{kind: kScalar, tag: "!!bool", str: strconv.FormatBool(b), pos: v.pos, plain: true}
}

// applyInputRules decides the options and default of the inputs with
// rules from the values of the inputs their conditions read, which are
// decided first (a cycle is an error). An input whose rules all fail to
// match has no options and, when not given, the empty string.
func (c *compiler) applyInputRules(specs []inputSpec, given map[string]inputArg, at Pos, what string) bool {
	value := func(s *inputSpec) (*node, bool) {
		if a, ok := given[s.name]; ok {
			if a.text {
				return textInput(s.typ, a.val), true
			}
			return a.val, true
		}
		return s.def, s.def != nil
	}
	byName := map[string]*inputSpec{}
	for i := range specs {
		byName[specs[i].name] = &specs[i]
	}
	done := map[string]bool{}
	for i := range specs {
		if specs[i].rules == nil {
			done[specs[i].name] = true
		}
	}
	for progress := true; progress; {
		progress = false
		for i := range specs {
			s := &specs[i]
			if done[s.name] {
				continue
			}
			ready := true
			for _, r := range s.rules {
				for _, ref := range r.refs {
					if byName[ref] == nil {
						c.d.errorf(r.pos, "%s: `%s` input: rules read unknown input %s", what, s.name, ref)
						return false
					}
					ready = ready && done[ref]
				}
			}
			if !ready {
				continue
			}
			vars := map[string]string{}
			bools := map[string]bool{} // boolean inputs, typed in conditions
			for name, o := range byName {
				if v, ok := value(o); ok && done[name] {
					vars[inputVar(name)] = rubyString(v)
					if b, isBool := yaml11Bool(v); isBool && o.typ == "boolean" {
						bools[inputVar(name)] = b
					}
				}
			}
			s.options, s.def = nil, nil
			mustEnter := false
			for _, r := range s.rules {
				if r.cond == nil || r.cond.evalTyped(vars, bools) {
					s.options = r.options
					if r.hasDef {
						s.def = r.def
					}
					// default: null (GitLab 18.9): the user must enter a
					// value, no default.
					if r.hasDef && r.def.isNull() {
						s.def, mustEnter = nil, true
					}
					break
				}
			}
			if _, isGiven := given[s.name]; s.def == nil && !isGiven && !mustEnter {
				// No rule gives a default: the input is optional and empty
				// (GitLab's "" whatever the type).
				s.def = &node{kind: kScalar, tag: "!!str", str: "", pos: s.pos}
			}
			done[s.name] = true
			progress = true
		}
	}
	for i := range specs {
		if !done[specs[i].name] {
			c.d.errorf(at, "%s: `%s` input: rules read inputs in a cycle", what, specs[i].name)
			return false
		}
	}
	return true
}

// checkInput checks one value (a default or a given value) of an input.
func (c *compiler) checkInput(s *inputSpec, v *node, isDefault bool, prefix string) {
	which := "provided"
	if isDefault {
		which = "default"
	}
	fail := func(format string, args ...any) {
		c.d.errorf(posOf(v), "%s`%s` input: %s", prefix, s.name, fmt.Sprintf(format, args...))
	}
	if v.isNull() {
		return // no value: nothing to check
	}
	article := "a"
	if s.typ == "array" {
		article = "an"
	}
	if inputType(v) != s.typ {
		fail("%s value is not %s %s", which, article, s.typ)
		return
	}
	if s.options != nil {
		found := false
		for _, o := range s.options {
			if sameValue(o, v) {
				found = true
				break
			}
		}
		if !found {
			fail("`%s` cannot be used because it is not in the list of allowed options", v.str)
		}
	}
	if s.regex != nil && !s.regex.MatchString(v.str) {
		fail("%s value does not match required RegEx pattern", which)
	}
}

// inputType is the input type a value has, "" for none (a mapping).
func inputType(v *node) string {
	switch v.kind {
	case kSeq:
		return "array"
	case kScalar:
		if _, ok := yaml11Bool(v); ok {
			return "boolean"
		}
		switch v.tag {
		case "!!int", "!!float":
			return "number"
		case "!!str":
			return "string"
		}
	}
	return ""
}

// sameValue is Ruby's == between an option and a value of the same type:
// numbers compare as numbers (1 == 1.0), strings as strings.
func sameValue(a, b *node) bool {
	ta, tb := inputType(a), inputType(b)
	if ta != tb {
		return false
	}
	if ta == "number" {
		x, ok1 := number(a.str)
		y, ok2 := number(b.str)
		return ok1 && ok2 && x == y
	}
	return a.str == b.str
}

// number reads a YAML number (decimal, 0x, 0o, underscores, .inf).
func number(s string) (float64, bool) {
	s = strings.ReplaceAll(s, "_", "")
	if i, err := strconv.ParseInt(s, 0, 64); err == nil {
		return float64(i), true
	}
	switch strings.ToLower(strings.TrimPrefix(s, "+")) {
	case ".inf":
		return math.Inf(1), true
	case "-.inf":
		return math.Inf(-1), true
	case ".nan":
		return math.NaN(), true
	}
	f, err := strconv.ParseFloat(s, 64)
	return f, err == nil
}

// textInput reads a pipeline input given as text as the input's type;
// text that is not one stays a string, for checkInput to refuse.
func textInput(typ string, v *node) *node {
	if v.kind != kScalar || v.tag != "!!str" {
		return v
	}
	s := strings.TrimSpace(v.str)
	switch typ {
	case "number":
		if _, err := strconv.ParseFloat(s, 64); err == nil {
			tag := "!!float"
			if _, err := strconv.ParseInt(s, 10, 64); err == nil {
				tag = "!!int"
			}
			return &node{kind: kScalar, tag: tag, str: s, pos: v.pos}
		}
	case "boolean":
		if s == "true" || s == "false" {
			return &node{kind: kScalar, tag: "!!bool", str: s, pos: v.pos}
		}
	case "array":
		var y yaml.Node
		if err := yaml.Unmarshal([]byte(s), &y); err == nil && len(y.Content) == 1 && y.Content[0].Kind == yaml.SequenceNode {
			var d diag
			l := &loader{file: v.pos.File, d: &d, memo: map[*yaml.Node]*node{}, active: map[*yaml.Node]bool{}, lim: Limits{}.withDefaults()}
			n := l.convert(y.Content[0], 0)
			if !d.failed() && size(n, 10_000, map[*node]int{}) <= 10_000 {
				return repos(n, v.pos)
			}
		}
	}
	return v
}

// repos gives a value's nodes a position (values typed on the command line
// or the API have none of their own).
func repos(n *node, p Pos) *node {
	c := *n
	c.pos = p
	if n.seq != nil {
		c.seq = make([]*node, len(n.seq))
		for i, x := range n.seq {
			c.seq[i] = repos(x, p)
		}
	}
	if n.m != nil {
		c.m = make([]entry, len(n.m))
		for i, e := range n.m {
			c.m[i] = entry{key: e.key, keyPos: p, val: repos(e.val, p)}
		}
	}
	return &c
}

// pipelineInputs turns Env.Inputs into input arguments at p.
func pipelineInputs(in map[string]any, p Pos) ([]inputArg, error) {
	names := make([]string, 0, len(in))
	for k := range in {
		names = append(names, k)
	}
	sort.Strings(names)
	var out []inputArg
	for _, k := range names {
		n, text, err := valueNode(in[k], p, 0)
		if err != nil {
			return nil, fmt.Errorf("pipeline input %s: %w", k, err)
		}
		out = append(out, inputArg{name: k, pos: p, val: n, text: text})
	}
	return out, nil
}

// valueNode converts a Go value of a pipeline input to a node. Strings are
// text (read as the input's type later).
func valueNode(v any, p Pos, depth int) (*node, bool, error) {
	if depth > 20 {
		return nil, false, fmt.Errorf("value nested too deeply")
	}
	switch x := v.(type) {
	case nil:
		return &node{kind: kNull, pos: p}, false, nil
	case string:
		return &node{kind: kScalar, tag: "!!str", str: x, pos: p}, true, nil
	case bool:
		return &node{kind: kScalar, tag: "!!bool", str: strconv.FormatBool(x), pos: p}, false, nil
	case int:
		return &node{kind: kScalar, tag: "!!int", str: strconv.Itoa(x), pos: p}, false, nil
	case int64:
		return &node{kind: kScalar, tag: "!!int", str: strconv.FormatInt(x, 10), pos: p}, false, nil
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1e15 {
			return &node{kind: kScalar, tag: "!!int", str: strconv.FormatInt(int64(x), 10), pos: p}, false, nil
		}
		return &node{kind: kScalar, tag: "!!float", str: strconv.FormatFloat(x, 'g', -1, 64), pos: p}, false, nil
	case []string:
		n := &node{kind: kSeq, pos: p}
		for _, s := range x {
			n.seq = append(n.seq, &node{kind: kScalar, tag: "!!str", str: s, pos: p})
		}
		return n, false, nil
	case []any:
		n := &node{kind: kSeq, pos: p}
		for _, e := range x {
			c, _, err := valueNode(e, p, depth+1)
			if err != nil {
				return nil, false, err
			}
			n.seq = append(n.seq, c)
		}
		return n, false, nil
	case map[string]any:
		n := &node{kind: kMap, pos: p}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			c, _, err := valueNode(x[k], p, depth+1)
			if err != nil {
				return nil, false, err
			}
			n.m = append(n.m, entry{key: k, keyPos: p, val: c})
		}
		return n, false, nil
	}
	return nil, false, fmt.Errorf("unsupported value type %T", v)
}

// interpolator replaces $[[ ]] blocks in a configuration document.
type interpolator struct {
	c      *compiler
	inputs map[string]*node
	// component is the component context spec:component exposes (empty
	// outside a component).
	component map[string]string
	memo      map[*node]*node
	blocks    map[string]bool
	failed    bool
}

// node interpolates n. After a failed block it goes on, so that every
// block's problem is reported at once; the result is then discarded.
func (ip *interpolator) node(n *node) *node {
	if n == nil {
		return n
	}
	if out, ok := ip.memo[n]; ok {
		return out
	}
	out := n
	switch n.kind {
	case kScalar:
		if n.tag == "!!str" && strings.Contains(n.str, "$[[") {
			out = ip.scalar(n)
		}
	case kMap:
		var m []entry
		for i, e := range n.m {
			k := e.key
			if strings.Contains(k, "$[[") {
				if v := ip.scalar(&node{kind: kScalar, tag: "!!str", str: k, pos: e.keyPos}); v != nil {
					k = v.str
					if v.kind != kScalar {
						k = rubyString(v)
					}
				}
			}
			v := ip.node(e.val)
			if m == nil && (k != e.key || v != e.val) {
				m = append(make([]entry, 0, len(n.m)), n.m[:i]...)
			}
			if m != nil {
				m = append(m, entry{key: k, keyPos: e.keyPos, val: v})
			}
		}
		if m != nil {
			c := *n
			c.m = m
			out = &c
		}
	case kSeq:
		var s []*node
		for i, x := range n.seq {
			v := ip.node(x)
			if s == nil && v != x {
				s = append(make([]*node, 0, len(n.seq)), n.seq[:i]...)
			}
			if s != nil {
				s = append(s, v)
			}
		}
		if s != nil {
			c := *n
			c.seq = s
			out = &c
		}
	}
	ip.memo[n] = out
	return out
}

// scalar interpolates one string: a value that is exactly one block takes
// the input's value with its type; blocks inside a longer string are
// replaced by the values as text (Ruby's to_s).
func (ip *interpolator) scalar(n *node) *node {
	ms := blockRe.FindAllStringSubmatchIndex(n.str, -1)
	if len(ms) == 0 {
		return n
	}
	if len(ms) == 1 && ms[0][0] == 0 && ms[0][1] == len(n.str) {
		v, ok := ip.block(n.str, n.str[ms[0][2]:ms[0][3]], n.pos)
		if !ok {
			return n
		}
		return v
	}
	var b strings.Builder
	last := 0
	for _, m := range ms {
		b.WriteString(n.str[last:m[0]])
		v, ok := ip.block(n.str[m[0]:m[1]], n.str[m[2]:m[3]], n.pos)
		if !ok {
			return n
		}
		b.WriteString(rubyString(v))
		last = m[1]
	}
	b.WriteString(n.str[last:])
	return &node{kind: kScalar, tag: "!!str", str: b.String(), pos: n.pos}
}

// block evaluates one block, GitLab's Interpolation::Block: access, then
// up to three functions, left to right.
func (ip *interpolator) block(text, data string, p Pos) (*node, bool) {
	fail := func(format string, args ...any) (*node, bool) {
		ip.c.d.errorf(p, "%s: %s", text, fmt.Sprintf(format, args...))
		ip.failed = true
		return nil, false
	}
	if skipInterpolation(data) {
		return &node{kind: kScalar, tag: "!!str", str: text, pos: p}, true
	}
	ip.blocks[text] = true
	if len(ip.blocks) > maxInterpolationBlocks {
		if len(ip.blocks) == maxInterpolationBlocks+1 {
			return fail("too many interpolation blocks (at most %d in a file)", maxInterpolationBlocks)
		}
		return nil, false
	}
	parts := strings.Split(data, "|")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	access, funcs := parts[0], parts[1:]
	objects := strings.SplitN(access, ".", maxAccessObjects)
	if len(objects) <= 1 {
		return fail("invalid interpolation access pattern")
	}
	if len(access) > maxAccessBytes {
		return fail("maximum interpolation expression size exceeded")
	}
	var v *node
	switch objects[0] {
	case "component":
		// The component context: what spec:component names, in a
		// component's files only (GitLab's message otherwise).
		cv, ok := ip.component[objects[1]]
		if !ok || len(objects) > 2 {
			return fail("unknown interpolation provided: `%s` in `%s`", objects[len(objects)-1], access)
		}
		v = &node{kind: kScalar, tag: "!!str", str: cv, pos: p}
	case "inputs":
		var ok bool
		if v, ok = ip.inputs[objects[1]]; !ok {
			return fail("unknown interpolation key: `%s`", objects[1])
		}
		for _, o := range objects[2:] {
			if v == nil || v.kind != kMap || v.get(o) == nil {
				return fail("unknown interpolation key: `%s`", o)
			}
			v = v.get(o)
		}
	default:
		return fail("unknown interpolation key: `%s`", objects[0])
	}
	if len(funcs) > maxBlockFunctions {
		return fail("too many functions in interpolation block")
	}
	type fn func(*node) (*node, string)
	var stack []fn
	for _, f := range funcs {
		g, ok := ip.function(f)
		if !ok {
			return fail("no function matching `%s`: check that the function name, arguments, and types are correct", f)
		}
		stack = append(stack, g)
	}
	for _, g := range stack {
		var msg string
		if v, msg = g(v); msg != "" {
			return fail("%s", msg)
		}
	}
	return at(v, p), true
}

var truncateRe = regexp.MustCompile(`^truncate\(\s*(\d+)\s*,\s*(\d+)\s*\)?$`)

// function matches one function expression of a block.
func (ip *interpolator) function(expr string) (func(*node) (*node, string), bool) {
	str := func(name string, f func(string) string) func(*node) (*node, string) {
		return func(v *node) (*node, string) {
			if v == nil || v.kind != kScalar || inputType(v) != "string" {
				return nil, fmt.Sprintf("error in `%s` function: invalid input type: %s can only be used with string inputs", name, name)
			}
			return &node{kind: kScalar, tag: "!!str", str: f(v.str), pos: v.pos}, ""
		}
	}
	switch {
	case expr == "expand_vars":
		return str("expand_vars", func(s string) string { return expandExisting(s, ip.c.baseVars) }), true
	case expr == "posix_escape":
		return str("posix_escape", shellEscape), true
	case truncateRe.MatchString(expr):
		m := truncateRe.FindStringSubmatch(expr)
		off, err1 := strconv.Atoi(m[1])
		n, err2 := strconv.Atoi(m[2])
		if err1 != nil || err2 != nil {
			return nil, false
		}
		return str("truncate", func(s string) string { return truncateRunes(s, off, n) }), true
	}
	return nil, false
}

// at returns v placed at p (a scalar or list put where the block was).
func at(v *node, p Pos) *node {
	if v == nil {
		return &node{kind: kNull, pos: p}
	}
	c := *v
	c.pos = p
	c.plain = false // an input's text is a string, never a YAML 1.1 boolean
	return &c
}

// truncateRunes is Ruby's str[offset, length].to_s.
func truncateRunes(s string, off, n int) string {
	if utf8.RuneCountInString(s) < off {
		return ""
	}
	r := []rune(s)
	end := off + n
	if end > len(r) || end < off {
		end = len(r)
	}
	return string(r[off:end])
}

// shellEscape is Ruby's Shellwords.shellescape.
func shellEscape(s string) string {
	if s == "" {
		return "''"
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n':
			b.WriteString("'\n'")
		case r < utf8.RuneSelf && (r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' ||
			strings.ContainsRune("_-.,:+/@", r)):
			b.WriteRune(r)
		default:
			b.WriteByte('\\')
			b.WriteRune(r)
		}
	}
	return b.String()
}

var existingVarRe = regexp.MustCompile(`\$([a-zA-Z_][a-zA-Z0-9_]*)|\$\{([a-zA-Z_][a-zA-Z0-9_]*)\}|%([a-zA-Z_][a-zA-Z0-9_]*)%`)

// expandExisting is GitLab's ExpandVariables.expand_existing: $VAR,
// ${VAR} and %VAR% of variables that exist are replaced; others stay.
func expandExisting(s string, vars map[string]string) string {
	return existingVarRe.ReplaceAllStringFunc(s, func(m string) string {
		sub := existingVarRe.FindStringSubmatch(m)
		name := sub[1] + sub[2] + sub[3]
		if v, ok := vars[name]; ok {
			return v
		}
		return m
	})
}

// rubyString is Ruby's to_s of an input value put inside a longer string:
// strings as they are, numbers and booleans as written, lists as Ruby
// prints them (["a", 1, true]).
func rubyString(v *node) string {
	if v == nil || v.kind == kNull {
		return ""
	}
	if v.kind == kScalar {
		switch inputType(v) {
		case "boolean":
			b, _ := yaml11Bool(v)
			return strconv.FormatBool(b)
		case "number":
			return rubyNumber(v)
		}
		return v.str
	}
	return rubyInspect(v)
}

// rubyNumber is Ruby's to_s of a number input: as Psych reads an unquoted
// one (psychScalar), else (a value given as text) the number it spells.
func rubyNumber(v *node) string {
	if v.plain {
		if s, kind := psychScalar(v.str); kind == psychValue {
			return s
		}
	}
	f, ok := number(v.str)
	if !ok {
		return v.str
	}
	if v.tag == "!!int" {
		if i, err := strconv.ParseInt(strings.ReplaceAll(v.str, "_", ""), 0, 64); err == nil {
			return strconv.FormatInt(i, 10)
		}
	}
	return rubyFloat(f)
}

func rubyInspect(v *node) string {
	switch v.kind {
	case kNull:
		return "nil"
	case kScalar:
		if inputType(v) == "string" {
			return strconv.Quote(v.str)
		}
		return rubyString(v)
	case kSeq:
		parts := make([]string, len(v.seq))
		for i, x := range v.seq {
			parts[i] = rubyInspect(x)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case kMap:
		parts := make([]string, len(v.m))
		for i, e := range v.m {
			parts[i] = strconv.Quote(e.key) + " => " + rubyInspect(e.val)
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return ""
}

// inputsKey is a canonical text of include:inputs, so that a file
// included twice with the same inputs is read once and with different
// inputs twice (GitLab compares the include's parameters).
func inputsKey(n *node) string {
	if n.isNull() {
		return ""
	}
	var b strings.Builder
	var walk func(*node)
	walk = func(n *node) {
		switch {
		case n == nil || n.kind == kNull:
			b.WriteString("~")
		case n.kind == kScalar:
			b.WriteString(inputType(n) + ":" + strconv.Quote(n.str))
		case n.kind == kSeq:
			b.WriteString("[")
			for _, x := range n.seq {
				walk(x)
				b.WriteString(",")
			}
			b.WriteString("]")
		case n.kind == kMap:
			es := append([]entry(nil), n.m...)
			sort.Slice(es, func(i, j int) bool { return es[i].key < es[j].key })
			b.WriteString("{")
			for _, e := range es {
				b.WriteString(strconv.Quote(e.key) + ":")
				walk(e.val)
				b.WriteString(",")
			}
			b.WriteString("}")
		}
	}
	walk(n)
	return b.String()
}
