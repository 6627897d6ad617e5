package ci

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v4"
)

// kind is the shape of a configuration value.
type kind uint8

const (
	kNull   kind = iota // null, ~ or empty
	kScalar             // string, number or boolean (tag tells which)
	kMap
	kSeq
	kRef // !reference [path...]; seq holds the path
)

// node is a YAML value with its position, after anchors, aliases and merge
// keys are resolved. Nodes are immutable once built and may be shared (an
// alias points at the same node as its anchor); every transformation builds
// new nodes.
type node struct {
	kind kind
	tag  string // short tag of scalars: !!str, !!int, !!float, !!bool, ...
	str  string
	pos  Pos
	m    []entry
	seq  []*node
	// plain is true for unquoted scalars (YAML 1.1 booleans like "yes").
	plain bool
}

type entry struct {
	key    string
	keyPos Pos
	val    *node
	// keyPlain: the key was written unquoted and untagged, so GitLab's
	// YAML loader may read it as other than a string (psychKeyType). A
	// plain :name key is a symbol: key holds its name and keyPlain is
	// false.
	keyPlain bool
}

func (n *node) get(key string) *node {
	if n == nil || n.kind != kMap {
		return nil
	}
	for i := range n.m {
		if n.m[i].key == key {
			return n.m[i].val
		}
	}
	return nil
}

func (n *node) entry(key string) *entry {
	if n == nil || n.kind != kMap {
		return nil
	}
	for i := range n.m {
		if n.m[i].key == key {
			return &n.m[i]
		}
	}
	return nil
}

// isNull reports whether the value is absent or null: GitLab treats a key
// with a null value as not specified.
func (n *node) isNull() bool { return n == nil || n.kind == kNull }

func (n *node) describe() string {
	if n == nil {
		return "nothing"
	}
	switch n.kind {
	case kNull:
		return "null"
	case kMap:
		return "a mapping"
	case kSeq:
		return "a list"
	case kRef:
		return "a !reference"
	}
	switch n.tag {
	case "!!int", "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	case "!!timestamp":
		return "a date"
	}
	return "a string"
}

// without returns a copy of a mapping with the given keys removed.
// withoutNulls is a mapping without its null-valued entries: GitLab's
// entries validate their keys with allow_nil, so "paths:" left empty is
// the same as no paths.
func (n *node) withoutNulls() *node {
	if n.kind != kMap {
		return n
	}
	c := *n
	c.m = nil
	for _, e := range n.m {
		if !e.val.isNull() {
			c.m = append(c.m, e)
		}
	}
	return &c
}

func (n *node) without(keys ...string) *node {
	c := *n
	c.m = nil
	for _, e := range n.m {
		drop := false
		for _, k := range keys {
			if e.key == k {
				drop = true
			}
		}
		if !drop {
			c.m = append(c.m, e)
		}
	}
	return &c
}

// deepMerge merges over into base like Ruby's Hash#deep_merge, which GitLab
// uses for include and extends: mappings merge key by key (base order
// first, new keys appended), anything else in over replaces base.
func deepMerge(base, over *node) *node { return deepMergeCount(base, over, nil) }

// deepMergeCount is deepMerge that adds the number of entries it creates
// to *count, so callers can stop runaway merges.
func deepMergeCount(base, over *node, count *int) *node {
	if base == nil {
		return over
	}
	if over == nil {
		return base
	}
	if base.kind != kMap || over.kind != kMap {
		return over
	}
	out := &node{kind: kMap, pos: over.pos}
	if count != nil {
		*count += len(base.m) + len(over.m)
	}
	out.m = make([]entry, 0, len(base.m)+len(over.m))
	out.m = append(out.m, base.m...)
	index := make(map[string]int, len(out.m))
	for i, e := range out.m {
		index[e.key] = i
	}
	for _, e := range over.m {
		if i, ok := index[e.key]; ok {
			out.m[i] = entry{key: e.key, keyPos: e.keyPos, val: deepMergeCount(out.m[i].val, e.val, count), keyPlain: e.keyPlain}
			continue
		}
		index[e.key] = len(out.m)
		out.m = append(out.m, e)
	}
	return out
}

// size counts the nodes of a tree as if every shared node were copied,
// stopping once limit is passed. It guards every later pass against alias
// and !reference bombs.
func size(n *node, limit int, memo map[*node]int) int {
	if n == nil {
		return 0
	}
	if s, ok := memo[n]; ok {
		return s
	}
	s := 1
	for _, e := range n.m {
		s += size(e.val, limit, memo)
		if s > limit {
			break
		}
	}
	for _, c := range n.seq {
		s += size(c, limit, memo)
		if s > limit {
			break
		}
	}
	if s > limit {
		s = limit + 1
	}
	memo[n] = s
	return s
}

var yamlLineRe = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// maxDocuments is how many YAML documents a file may hold: a spec: header
// and the configuration (GitLab's MAX_DOCUMENTS).
const maxDocuments = 2

// parseYAML reads the YAML documents of a file (at most two: a spec:
// header, then the configuration) into node trees. Empty documents are
// nil. No documents and no errors means the file is empty.
func parseYAML(file string, data []byte, d *diag, lim Limits) (docs []*node) {
	defer func() {
		// go-yaml (v3) has panicked on hostile input in the past; never let it
		// take the caller down.
		if r := recover(); r != nil {
			d.errorf(Pos{File: file, Line: 1, Col: 1}, "invalid YAML: %v", r)
			docs = nil
		}
	}()
	if len(data) > lim.MaxFileBytes {
		d.errorf(Pos{File: file, Line: 1, Col: 1}, "file is %d bytes, more than the limit of %d", len(data), lim.MaxFileBytes)
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var raw []*yaml.Node
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			p, msg := yamlError(file, err)
			d.errorf(p, "invalid YAML: %s", msg)
			return nil
		}
		if len(raw) == maxDocuments {
			p := Pos{File: file, Line: doc.Line, Col: doc.Column}
			if p.Line == 0 {
				p.Line, p.Col = 1, 1
			}
			d.errorf(p, "more than %d YAML documents: a file holds at most a spec: header and the configuration", maxDocuments)
			return nil
		}
		raw = append(raw, &doc)
	}
	// One loader for both documents: anchors do not cross documents in
	// YAML, and the node count limit covers the whole file.
	l := &loader{file: file, d: d, memo: map[*yaml.Node]*node{}, active: map[*yaml.Node]bool{}, lim: lim}
	memo := map[*node]int{}
	total := 0
	for _, doc := range raw {
		if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
			docs = append(docs, nil)
			continue
		}
		root := l.convert(doc.Content[0], 0)
		if root != nil {
			total += size(root, lim.MaxNodes, memo)
			if total > lim.MaxNodes {
				d.errorf(root.pos, "document expands to more than %d values (aliases are counted at every use)", lim.MaxNodes)
				return nil
			}
		}
		docs = append(docs, root)
	}
	return docs
}

// yamlError is where a YAML syntax error is (the character the parser
// stopped at) and what it is, with the construct it was in and where that
// began, in the words of libyaml (and so of GitLab's Psych): "did not
// find expected '-' indicator while parsing a block collection at line 5
// column 7".
func yamlError(file string, err error) (Pos, string) {
	var le *yaml.LoadError
	if !errors.As(err, &le) {
		if m := yamlLineRe.FindStringSubmatch(err.Error()); m != nil {
			n, _ := strconv.Atoi(m[1])
			return Pos{File: file, Line: n, Col: 1}, m[2]
		}
		return Pos{File: file, Line: 1, Col: 1}, strings.TrimPrefix(err.Error(), "yaml: ")
	}
	at := le.Mark
	if at.Line == 0 {
		at = le.ContextMark
	}
	p := Pos{File: file, Line: max(at.Line, 1), Col: max(at.Column, 1)}
	msg := le.Message
	if le.ContextMsg != "" {
		msg += " " + le.ContextMsg
		if c := le.ContextMark; c.Line > 0 {
			msg += fmt.Sprintf(" at line %d column %d", c.Line, max(c.Column, 1))
		}
	}
	return p, msg
}

type loader struct {
	file   string
	d      *diag
	memo   map[*yaml.Node]*node
	active map[*yaml.Node]bool
	lim    Limits
}

func (l *loader) pos(n *yaml.Node) Pos { return Pos{File: l.file, Line: n.Line, Col: n.Column} }

func (l *loader) convert(n *yaml.Node, depth int) *node {
	if depth > l.lim.MaxDepth {
		l.d.errorf(l.pos(n), "YAML nesting deeper than %d levels", l.lim.MaxDepth)
		return &node{kind: kNull, pos: l.pos(n)}
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			l.d.errorf(l.pos(n), "unknown alias %q", n.Value)
			return &node{kind: kNull, pos: l.pos(n)}
		}
		return l.convertShared(n.Alias, depth+1)
	}
	if n.Anchor != "" {
		return l.convertShared(n, depth)
	}
	return l.convertNode(n, depth)
}

func (l *loader) convertShared(n *yaml.Node, depth int) *node {
	if c, ok := l.memo[n]; ok {
		return c
	}
	if l.active[n] {
		l.d.errorf(l.pos(n), "anchor %q refers to itself", n.Anchor)
		return &node{kind: kNull, pos: l.pos(n)}
	}
	l.active[n] = true
	c := l.convertNode(n, depth)
	delete(l.active, n)
	l.memo[n] = c
	return c
}

func (l *loader) convertNode(n *yaml.Node, depth int) *node {
	p := l.pos(n)
	if n.Tag == "!reference" {
		if n.Kind != yaml.SequenceNode {
			l.d.errorf(p, "!reference must be a list of keys, like !reference [.job, script]")
			return &node{kind: kNull, pos: p}
		}
		r := &node{kind: kRef, pos: p}
		for _, c := range n.Content {
			cv := l.convert(c, depth+1)
			if cv.kind != kScalar {
				l.d.errorf(cv.pos, "!reference keys must be strings, found %s", cv.describe())
				return &node{kind: kNull, pos: p}
			}
			r.seq = append(r.seq, cv)
		}
		if len(r.seq) == 0 {
			l.d.errorf(p, "!reference needs at least one key")
			return &node{kind: kNull, pos: p}
		}
		return r
	}
	if strings.HasPrefix(n.Tag, "!") && !strings.HasPrefix(n.Tag, "!!") {
		l.d.errorf(p, "unsupported YAML tag %s", n.Tag)
		return &node{kind: kNull, pos: p}
	}
	switch n.Kind {
	case yaml.ScalarNode:
		tag := n.ShortTag()
		if tag == "!!null" {
			return &node{kind: kNull, pos: p}
		}
		return &node{kind: kScalar, tag: tag, str: n.Value, pos: p, plain: n.Style == 0}
	case yaml.SequenceNode:
		out := &node{kind: kSeq, pos: p, seq: make([]*node, 0, len(n.Content))}
		for _, c := range n.Content {
			out.seq = append(out.seq, l.convert(c, depth+1))
		}
		return out
	case yaml.MappingNode:
		return l.mapping(n, depth)
	}
	l.d.errorf(p, "unsupported YAML node")
	return &node{kind: kNull, pos: p}
}

// mapping converts a YAML mapping, applying merge keys (<<) in order as
// GitLab's YAML loader (Ruby's Psych) does: a merge sets its keys over
// those already there, a key written after it sets it again, and among
// the mappings of one merge the earlier wins. (The YAML merge spec lets
// written keys win wherever they are; the two differ only for a << after
// a key it also sets, which is warned about.)
func (l *loader) mapping(n *yaml.Node, depth int) *node {
	out := &node{kind: kMap, pos: l.pos(n)}
	index := map[string]int{}
	fromMerge := map[int]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Value == "<<" && (k.ShortTag() == "!!merge" || k.Tag == "!!merge") {
			seen := map[string]bool{}
			for _, src := range l.mergeSources(v, depth) {
				for _, e := range src.m {
					if seen[e.key] {
						continue
					}
					seen[e.key] = true
					j, ok := index[e.key]
					if !ok {
						index[e.key] = len(out.m)
						fromMerge[len(out.m)] = true
						out.m = append(out.m, e)
						continue
					}
					if !fromMerge[j] {
						l.d.warnf(l.pos(k), "merge key << after key %q (at %s) replaces its value, as in GitLab: put << first to keep it", e.key, out.m[j].keyPos)
					}
					out.m[j], fromMerge[j] = e, true
				}
			}
			continue
		}
		kk := k
		if kk.Kind == yaml.AliasNode && kk.Alias != nil {
			kk = kk.Alias
		}
		if kk.Kind != yaml.ScalarNode {
			l.d.errorf(l.pos(k), "mapping keys must be strings")
			continue
		}
		key, plain := psychKey(kk.Value, kk.Style == 0)
		val := l.convert(v, depth+1)
		e := entry{key: key, keyPos: l.pos(k), val: val, keyPlain: plain}
		if j, ok := index[key]; ok {
			if !fromMerge[j] {
				l.d.warnf(l.pos(k), "duplicate key %q (first at %s); the last one wins, as in GitLab", key, out.m[j].keyPos)
			}
			out.m[j], fromMerge[j] = e, false
			continue
		}
		index[key] = len(out.m)
		out.m = append(out.m, e)
	}
	return out
}

func (l *loader) mergeSources(v *yaml.Node, depth int) []*node {
	cv := l.convert(v, depth+1)
	switch cv.kind {
	case kMap:
		return []*node{cv}
	case kSeq:
		var out []*node
		for _, c := range cv.seq {
			if c.kind != kMap {
				l.d.errorf(c.pos, "merge key << needs mappings, found %s", c.describe())
				continue
			}
			out = append(out, c)
		}
		return out
	}
	l.d.errorf(cv.pos, "merge key << needs a mapping or a list of mappings, found %s", cv.describe())
	return nil
}

// scalarString returns a scalar's text, or false when n is not a scalar.
func scalarString(n *node) (string, bool) {
	if n == nil || n.kind != kScalar {
		return "", false
	}
	return n.str, true
}

// keyType is what Psych reads a mapping key as.
type keyType uint8

const (
	keyString keyType = iota // or a symbol, :name, which GitLab's keys become anyway (the loader names it)
	keyBool
	keyNull
	keyNumber
	keyDate
)

func (t keyType) String() string {
	return [...]string{"a string", "a boolean", "null", "a number", "a date"}[t]
}

// psychKey is the name GitLab gives the mapping key written as v (plain:
// unquoted and untagged), and whether that name is still plain, so may be
// read as other than a string (psychKeyType). GitLab symbolizes every key,
// and a plain :name is already the Symbol name to Psych: :build: and
// build: are the same key, "build".
func psychKey(v string, plain bool) (string, bool) {
	if plain && psychSymbolRe.MatchString(v) {
		name, _ := psychScalar(v)
		return name, false
	}
	return v, plain
}

// psychKeyType is what Psych (GitLab's YAML loader, YAML 1.1) reads the
// plain mapping key v as.
func psychKeyType(v string) keyType {
	switch psychWord(v) {
	case wordTrue, wordFalse:
		return keyBool
	case wordNull:
		return keyNull
	}
	switch _, kind := psychScalar(v); {
	case kind == psychDate:
		return keyDate
	case kind == psychValue && !psychSymbolRe.MatchString(v):
		return keyNumber
	}
	return keyString
}

// yaml11Bool reports whether a plain scalar is a boolean in YAML 1.1, which
// GitLab's parser (Psych) uses: true/false plus yes/no/on/off, in any case
// (psychWord).
func yaml11Bool(n *node) (bool, bool) {
	if n == nil || n.kind != kScalar {
		return false, false
	}
	if n.tag == "!!bool" {
		b, err := strconv.ParseBool(strings.ToLower(n.str))
		return b, err == nil
	}
	if !n.plain || n.tag != "!!str" {
		return false, false
	}
	switch psychWord(n.str) {
	case wordTrue:
		return true, true
	case wordFalse:
		return false, true
	}
	return false, false
}

func quoteList(s []string) string {
	q := make([]string, len(s))
	for i, x := range s {
		q[i] = strconv.Quote(x)
	}
	return strings.Join(q, ", ")
}
