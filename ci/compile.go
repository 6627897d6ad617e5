package ci

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
)

// Compile reads the configuration at src.Path in src.FS with its local
// includes, resolves anchors, extends and !reference, validates every
// keyword, expands parallel and matrix jobs, evaluates workflow and job
// rules with env, and builds the job graph.
//
// When the configuration is invalid the error is an ErrorList with every
// problem found, each at a file:line:col. Any other error comes from
// reading src.FS, from env's functions, or from ctx.
func Compile(ctx context.Context, src Source, env Env) (*Pipeline, error) {
	if src.FS == nil {
		return nil, errors.New("compiling CI configuration: no file system given")
	}
	c := &compiler{
		ctx:      ctx,
		src:      src,
		env:      env,
		lim:      env.Limits.withDefaults(),
		included: map[string]bool{},

		resolvedFiles: map[string]resolved{},
		names:         map[string]string{},
	}
	c.baseVars = map[string]string{}
	for k, v := range env.Predefined {
		c.baseVars[k] = v
	}
	for k, v := range env.Variables {
		c.baseVars[k] = v
	}
	if err := ctx.Err(); err != nil {
		return nil, wrapf(err, "compiling CI configuration")
	}
	root := c.load()
	if c.ioErr != nil {
		return nil, c.ioErr
	}
	if root == nil {
		return nil, c.d.list()
	}
	// An include that failed leaves the main file to check: its other
	// problems are reported too (all at once, as promised), except those
	// the missing file could explain (unresolved).
	c.incomplete = c.incomplete || c.d.failed()
	root = c.extend(root)
	if c.d.failed() && !c.incomplete {
		return nil, c.d.list()
	}
	root = c.resolveRefs(root)
	if c.d.failed() && !c.incomplete {
		return nil, c.d.list()
	}
	if size(root, c.lim.MaxNodes, map[*node]int{}) > c.lim.MaxNodes {
		c.d.errorf(root.pos, "configuration expands to more than %d values after extends and !reference", c.lim.MaxNodes)
		return nil, c.d.list()
	}
	p := c.build(root)
	if c.ioErr != nil {
		return nil, c.ioErr
	}
	if err := ctx.Err(); err != nil {
		return nil, wrapf(err, "compiling CI configuration")
	}
	if c.d.failed() {
		return nil, c.d.list()
	}
	p.Warnings = c.d.sortedWarnings()
	return p, nil
}

type compiler struct {
	ctx      context.Context
	src      Source
	env      Env
	lim      Limits
	d        diag
	ioErr    error
	included map[string]bool
	// resolvedFiles memoizes Env.Includes answers by include identity.
	resolvedFiles map[string]resolved
	// names are the locations of loaded files by identity, for messages.
	names map[string]string
	// incomplete is set when an include could not be loaded: what it
	// might have defined (templates, jobs, stages) is unknown.
	incomplete bool
	baseVars   map[string]string // predefined + caller variables
	mainFile   string            // the main file's path, cleaned
}

// unresolved records a problem of a name that was not found, unless an
// include failed: the name may be defined in the file that is missing.
func (c *compiler) unresolved(p Pos, format string, args ...any) {
	if !c.incomplete {
		c.d.errorf(p, format, args...)
	}
}

// unresolvedIf is unresolved when cond (the problem may come from a
// missing file), else an error.
func (c *compiler) unresolvedIf(cond bool, p Pos, format string, args ...any) {
	if cond {
		c.unresolved(p, format, args...)
		return
	}
	c.d.errorf(p, format, args...)
}

func wrapf(err error, format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, err)...)
}

// reservedTop are the top-level keys that are not jobs. default and
// workflow are not reserved in GitLab (Entry::Root): a mapping there that
// looks like a job (jobShaped) is a job of that name. Nor is spec, outside
// a header document (see headerShaped).
var reservedTop = map[string]bool{
	"image": true, "services": true, "stages": true, "types": true, "before_script": true,
	"after_script": true, "variables": true, "cache": true, "include": true, "default": true,
	"workflow": true,
}

// mayBeJob reports whether the top-level key may name a job: any key that
// is not reserved, and default: and workflow:, which are jobs when their
// value is jobShaped (after extends, which GitLab applies to every key).
func mayBeJob(key string) bool {
	return !reservedTop[key] || key == "default" || key == "workflow"
}

// jobShaped: a mapping with script, run or trigger (GitLab's
// Job.matching? and Bridge.matching?).
func jobShaped(n *node) bool {
	return n != nil && n.kind == kMap && (n.entry("script") != nil || n.entry("run") != nil || n.entry("trigger") != nil)
}

// headerShaped reports whether a spec: value in a configuration document
// reads as a misplaced header (only header keys) rather than a job named
// spec. GitLab takes a first document as the header only when a second
// follows; in the configuration, spec is an ordinary job name (GitLab's
// own Crystal template has a spec job), and a header written there is a
// job with unknown keys to GitLab. Berth says what was meant instead.
func headerShaped(n *node) bool {
	if n == nil || n.kind != kMap || len(n.m) == 0 {
		return false
	}
	for _, e := range n.m {
		switch e.key {
		case "inputs", "component", "description", "include":
		default:
			return false
		}
	}
	return true
}

// defaultKeys are the keys default: may hold; jobs inherit them unless
// they set the key themselves or inherit:default says otherwise.
var defaultKeys = []string{"after_script", "artifacts", "before_script", "cache", "hooks",
	"id_tokens", "image", "interruptible", "isolation", "retry", "services", "tags", "timeout"}

// globalDefaults are the deprecated top-level forms of default keys.
var globalDefaults = []string{"image", "services", "cache", "before_script", "after_script"}

var defaultStages = []string{".pre", "build", "test", "deploy", ".post"}

type globals struct {
	stages        []string
	stagePos      map[string]Pos
	vars          []Variable
	defaults      *node // mapping of default keys
	workflowRules []*rule
	workflowSet   bool
	name          string
}

func (c *compiler) build(root *node) *Pipeline {
	g := &globals{stages: defaultStages}
	defaults := &node{kind: kMap, pos: root.pos}
	var jobEntries []entry
	for _, e := range root.m {
		switch e.key {
		case "stages":
			g.stages = c.stages(e.val)
		case "types":
			c.d.errorf(e.keyPos, "types was removed from GitLab CI; use stages")
		case "spec":
			// A header is its own document (checked while loading): here
			// spec: is a job, unless it reads as a misplaced header.
			if !headerShaped(e.val) {
				jobEntries = append(jobEntries, e)
				continue
			}
			c.d.errorf(e.keyPos, "spec: must be a YAML document of its own: write spec:, then a line ---, then the configuration")
		case "variables":
			if !e.val.isNull() {
				g.vars = c.variables(e.val, "variables", true)
			}
		case "default", "workflow":
			if jobShaped(e.val) {
				jobEntries = append(jobEntries, e) // a job of that name
				continue
			}
			if e.key == "workflow" {
				c.workflow(e.val, g)
				continue
			}
			if e.val.isNull() {
				continue
			}
			if !c.mapping(e.val, "default") {
				continue
			}
			c.checkKeys(e.val, "default", defaultKeys...)
			for _, d := range e.val.m {
				if indexOf(defaultKeys, d.key) >= 0 {
					defaults.m = append(defaults.m, d)
				}
			}
		case "include":
			// handled while loading
		default:
			if indexOf(globalDefaults, e.key) >= 0 {
				continue // merged below
			}
			// GitLab's job names are the file's keys as symbols: true:
			// or 1: is a job named by a boolean or a number, and so is
			// .5: (0.5, not a hidden job). Only a plain key can be.
			if e.keyPlain {
				if t := psychKeyType(e.key); t != keyString {
					c.d.errorf(e.keyPos, "jobs:%s name should be a Symbol: GitLab's YAML loader reads the unquoted key %s as %s; quote it", e.key, e.key, t)
					continue
				}
			}
			if strings.HasPrefix(e.key, ".") {
				continue // hidden: a template only
			}
			jobEntries = append(jobEntries, e)
		}
	}
	for _, k := range globalDefaults {
		e := root.entry(k)
		if e == nil || e.val.isNull() {
			continue
		}
		if defaults.get(k) != nil {
			c.d.errorf(e.keyPos, "%s is set both at the top level and in default; keep only default:%s", k, k)
			continue
		}
		defaults.m = append(defaults.m, *e)
	}
	g.defaults = defaults
	// Parse default values once so their errors show even if no job
	// inherits them.
	c.parseDefaults(defaults)
	c.checkCallerIsolation(c.mainFile)

	if len(jobEntries) == 0 {
		c.unresolved(root.pos, "jobs config should contain at least one visible job")
	}

	specs := make([]*jobSpec, 0, len(jobEntries))
	for i, e := range jobEntries {
		if s := c.parseJob(e, g, i); s != nil {
			specs = append(specs, s)
		}
	}
	c.checkEnvironments(specs)
	if c.d.failed() {
		return nil
	}

	p := &Pipeline{Stages: g.stages, Name: g.name, WorkflowRule: -1}

	// Workflow rules decide whether there is a pipeline at all.
	wfVars := c.layer(nil, g.vars, nil)
	created := true
	var wfRuleVars []Variable
	if g.workflowSet {
		i := c.firstMatch(g.workflowRules, wfVars)
		p.WorkflowRule = i
		switch {
		case i < 0:
			created, p.Reason = false, "workflow:rules: no rule matched"
		case g.workflowRules[i].when == Never:
			created, p.Reason = false, fmt.Sprintf("workflow:rules: rule %d matched with when: never", i+1)
		default:
			wfRuleVars = g.workflowRules[i].variables
		}
	}
	p.Variables = mergeVars(g.vars, wfRuleVars)

	insts := c.expand(specs, g)
	if c.d.failed() {
		return nil
	}
	c.staticGraph(insts)
	c.checkTriggerArtifacts(insts)
	if c.d.failed() || c.ioErr != nil {
		return nil
	}
	if !created {
		p.Created = false
		return p
	}
	c.evalRules(insts, g, wfRuleVars)
	if c.ioErr != nil || c.d.failed() {
		return nil
	}
	// The jobs a pipeline creates are bounded after rules (GitLab's
	// ci_pipeline_size), those its file defines by the expansion bound.
	jobs := 0
	for _, in := range insts {
		if in.included {
			jobs++
		}
	}
	if jobs > c.lim.MaxJobs {
		c.d.errorf(Pos{File: c.mainFile, Line: 1, Col: 1}, "the pipeline would create %d jobs, more than %d", jobs, c.lim.MaxJobs)
		return nil
	}
	c.finalGraph(insts, p)
	c.resolveCacheKeys(p)
	return p
}

// resolveCacheKeys computes cache:key:files and files_commits keys
// through Env.CacheKey.
func (c *compiler) resolveCacheKeys(p *Pipeline) {
	if c.env.CacheKey == nil {
		return
	}
	memo := map[string]string{}
	for _, j := range p.Jobs {
		for i := range j.Cache {
			cc := &j.Cache[i]
			if len(cc.KeyFiles) == 0 || c.ioErr != nil {
				continue
			}
			id := fmt.Sprint(cc.KeyByCommits, "\x00", strings.Join(cc.KeyFiles, "\x00"))
			digest, ok := memo[id]
			if !ok {
				d, err := c.env.CacheKey(c.ctx, cc.KeyFiles, cc.KeyByCommits)
				if err != nil {
					c.ioErr = wrapf(err, "computing cache key of job %s", j.Name)
					return
				}
				memo[id], digest = d, d
			}
			if digest == "" {
				digest = "default"
			}
			cc.Key = digest
			if cc.KeyPrefix != "" {
				cc.Key = cc.KeyPrefix + "-" + digest
			}
		}
	}
}

func (c *compiler) stages(n *node) []string {
	if n.isNull() {
		return defaultStages
	}
	list, ok := c.strList(n, "stages", false, true)
	if !ok {
		return defaultStages
	}
	out := []string{".pre"}
	seen := map[string]bool{".pre": true, ".post": true}
	for _, s := range list {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return append(out, ".post")
}

func (c *compiler) workflow(n *node, g *globals) {
	if n.isNull() || !c.mapping(n, "workflow") {
		return
	}
	c.checkKeys(n, "workflow", "rules", "name", "auto_cancel")
	if x := n.get("rules"); x != nil && !x.isNull() {
		g.workflowRules = c.rules(x, "workflow:rules", ruleWorkflow)
		g.workflowSet = true
	}
	if x := n.get("name"); x != nil {
		g.name, _ = c.str(x, "workflow:name")
		if n := utf8.RuneCountInString(g.name); n > 255 {
			c.d.errorf(x.pos, "workflow name is too long (maximum is 255 characters, found %d)", n)
		}
	}
	if x := n.entry("auto_cancel"); x != nil {
		c.d.warnf(x.keyPos, "workflow:auto_cancel is ignored: Berth does not auto-cancel pipelines")
	}
}

func (c *compiler) parseDefaults(d *node) {
	for _, e := range d.m {
		at := "default:" + e.key
		if e.val.isNull() {
			continue
		}
		switch e.key {
		case "after_script", "before_script":
			c.script(e.val, at)
		case "artifacts":
			c.artifacts(e.val, at)
		case "cache":
			c.caches(e.val, at)
		case "image":
			c.image(e.val, at, false)
		case "services":
			c.services(e.val, at)
		case "interruptible":
			c.boolean(e.val, at)
		case "isolation":
			c.isolationKeyword(e.val, at)
		case "retry":
			c.retry(e.val, at)
		case "tags":
			c.strList(e.val, at, false, true)
		case "timeout":
			c.duration(e.val, at, maxTimeout)
		case "hooks":
			c.hooks(e.val, at)
		case "id_tokens":
			c.idTokens(e.val, at)
		}
	}
}

// layer builds the variables a rules expression sees: predefined, then
// YAML layers in order, then the caller's variables, which win.
func (c *compiler) layer(extra map[string]string, yamlLayers ...[]Variable) map[string]string {
	out := map[string]string{}
	for k, v := range c.env.Predefined {
		out[k] = v
	}
	for k, v := range extra {
		out[k] = v
	}
	for _, l := range yamlLayers {
		for _, v := range l {
			out[v.Key] = v.Value
		}
	}
	for k, v := range c.env.Variables {
		out[k] = v
	}
	return out
}

// mergeVars merges variable lists; later lists override earlier ones,
// keeping the position in the list where the key first appeared.
func mergeVars(lists ...[]Variable) []Variable {
	var out []Variable
	idx := map[string]int{}
	for _, l := range lists {
		for _, v := range l {
			if i, ok := idx[v.Key]; ok {
				out[i] = v
				continue
			}
			idx[v.Key] = len(out)
			out = append(out, v)
		}
	}
	return out
}

func sortInstances(insts []*instance) {
	sort.SliceStable(insts, func(i, j int) bool {
		a, b := insts[i], insts[j]
		if a.job.StageIndex != b.job.StageIndex {
			return a.job.StageIndex < b.job.StageIndex
		}
		return a.spec.order < b.spec.order
	})
}
