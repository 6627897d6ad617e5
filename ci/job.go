package ci

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/berthci/berth/executor"
)

const (
	maxTimeout  = 30 * 24 * time.Hour // GitLab: one month
	maxStartIn  = 7 * 24 * time.Hour  // GitLab: one week
	maxParallel = 200
	// gitlabMaxNeeds is GitLab's default ci_max_needs: more warns; the
	// error comes at Limits.MaxNeeds.
	gitlabMaxNeeds = 50
)

// jobKeys are the job keywords Berth supports.
var jobKeys = []string{"after_script", "allow_failure", "artifacts", "before_script", "cache",
	"coverage", "dependencies", "environment", "extends", "hooks", "image", "inherit",
	"interruptible", "isolation", "needs", "only", "except", "parallel", "resource_group", "retry", "rules", "script",
	"services", "stage", "start_in", "tags", "timeout", "type", "variables", "when",
	"manual_confirmation", "release", "pages", "publish", "trigger", "id_tokens", "secrets"}

// unsupportedJobKeys are GitLab job keywords Berth rejects, with why.
var unsupportedJobKeys = map[string]string{
	"identity":           "identity is not supported",
	"dast_configuration": "dast_configuration is not supported",
	"run":                "run (CI steps) is not supported; use script",
	"inputs":             "job inputs are not supported",
}

type needSpec struct {
	cross     *CrossNeed // needs:pipeline or needs:project; the rest is unset
	job       string
	artifacts bool
	optional  bool
	pos       Pos
	matrix    []map[string]string // needs:parallel:matrix combinations
}

type depSpec struct {
	job string
	pos Pos
}

type parallelSpec struct {
	total  int
	combos [][]Variable // nil for parallel: N
	pos    Pos
}

// jobSpec is a parsed job before parallel expansion and rules.
type jobSpec struct {
	name        string
	pos         Pos
	order       int
	job         Job // static fields
	stagePos    Pos
	whenSet     bool
	afSet       bool
	needs       []needSpec
	needsSet    bool
	needsPos    Pos
	deps        []depSpec
	depsSet     bool
	parallel    *parallelSpec
	rules       []*rule
	rulesSet    bool
	only        *onlySpec // nil: not set
	except      *onlySpec
	envPos      Pos
	actionSet   bool // environment:action written (not start by default)
	inheritVars func(string) bool
	jobVars     []Variable
	isolation   executor.Isolation // the isolation keyword, own or from default:
}

func (c *compiler) parseJob(e entry, g *globals, order int) *jobSpec {
	name := e.key
	at := "jobs:" + name
	n := e.val
	if n.kind != kMap {
		c.d.errorf(e.keyPos, "%s config should be a mapping of keywords, found %s", at, n.describe())
		return nil
	}
	if len(name) > 255 {
		c.d.errorf(e.keyPos, "%s: job name is longer than 255 characters", at)
	}
	bridge := !n.get("trigger").isNull()
	for _, k := range n.m {
		if bridge && indexOf(bridgeKeys, k.key) < 0 && (indexOf(jobKeys, k.key) >= 0 || unsupportedJobKeys[k.key] != "") {
			c.d.errorf(k.keyPos, "%s: a trigger job cannot use %s (allowed: %s)", at, k.key, strings.Join(bridgeKeys, ", "))
			continue
		}
		if why, ok := unsupportedJobKeys[k.key]; ok {
			c.d.errorf(k.keyPos, "%s:%s: %s", at, k.key, why)
			continue
		}
		if indexOf(jobKeys, k.key) < 0 {
			c.d.errorf(k.keyPos, "%s: unknown keyword %q", at, k.key)
		}
	}

	s := &jobSpec{name: name, pos: e.keyPos, order: order}
	j := &s.job
	j.Name, j.BaseName, j.Pos = name, name, e.keyPos
	j.When = OnSuccess
	j.Scheduling = ScheduleStage

	inheritDefault, inheritVars := c.inherit(n.get("inherit"), at+":inherit", g)

	// Effective keys: the job's own, then inherited defaults it lacks.
	// A null keyword is unset, except script, whose presence GitLab
	// validates (below): script: with nothing after it is blank.
	eff := &node{kind: kMap, pos: n.pos}
	for _, k := range n.m {
		if !k.val.isNull() || k.key == "script" && !bridge {
			eff.m = append(eff.m, k)
		}
	}
	for _, d := range g.defaults.m {
		// A bridge has none of the keywords default: sets.
		if !bridge && eff.get(d.key) == nil && inheritDefault(d.key) && !d.val.isNull() {
			eff.m = append(eff.m, d)
		}
	}

	stage, stagePos := "test", e.keyPos
	for _, k := range eff.m {
		kat := at + ":" + k.key
		v := k.val
		switch k.key {
		case "stage":
			if st, ok := c.str(v, kat); ok {
				stage, stagePos = st, v.pos
			}
		case "type":
			if n.get("stage") == nil {
				if st, ok := c.str(v, kat); ok {
					stage, stagePos = st, v.pos
				}
			}
			c.d.warnf(k.keyPos, "%s: type is deprecated; use stage", at)
		case "script":
			// GitLab validates its presence: null, "" and [] are refused.
			if v.isNull() || v.kind == kSeq && len(v.seq) == 0 || v.kind == kScalar && v.str == "" {
				c.d.errorf(v.pos, "%s script can't be blank", at)
				continue
			}
			j.Script, _ = c.script(v, kat)
		case "before_script":
			j.BeforeScript, _ = c.script(v, kat)
		case "after_script":
			j.AfterScript, _ = c.script(v, kat)
		case "hooks":
			j.PreGetSourcesScript = c.hooks(v, kat)
		case "image":
			j.Image = c.image(v, kat, false)
		case "services":
			j.Services = c.services(v, kat)
		case "tags":
			j.Tags, _ = c.strList(v, kat, false, true)
		case "variables":
			s.jobVars = c.variables(v, kat, false)
		case "cache":
			j.Cache = c.caches(v, kat)
		case "artifacts":
			j.Artifacts = c.artifacts(v, kat)
		case "timeout":
			j.Timeout, _ = c.duration(v, kat, maxTimeout)
		case "retry":
			j.Retry = c.retry(v, kat)
		case "allow_failure":
			s.afSet = true
			if v.kind == kMap {
				c.checkKeys(v, kat, "exit_codes")
				if x := v.get("exit_codes"); x != nil {
					j.AllowFailureExitCodes = c.exitCodes(x, kat+":exit_codes")
				} else {
					c.d.errorf(v.pos, "%s: exit_codes is required", kat)
				}
			} else {
				j.AllowFailure, _ = c.boolean(v, kat)
			}
		case "when":
			allowed := []string{"on_success", "on_failure", "always", "manual", "delayed"}
			if bridge {
				allowed = allowed[:4] // GitLab's Bridge::ALLOWED_WHEN
			}
			w, ok := c.oneOf(v, kat, allowed...)
			if ok {
				j.When, s.whenSet = When(w), true
			}
		case "start_in":
			j.StartIn, _ = c.duration(v, kat, maxStartIn)
		case "interruptible":
			j.Interruptible, _ = c.boolean(v, kat)
		case "isolation":
			s.isolation = c.isolationKeyword(v, kat)
		case "resource_group":
			j.ResourceGroup, _ = c.str(v, kat)
		case "environment":
			j.Environment = c.environment(v, kat)
			s.envPos = v.pos
			s.actionSet = v.kind == kMap && !v.get("action").isNull()
			if x := v.get("on_stop"); x != nil {
				s.envPos = x.pos
			}
		case "coverage":
			j.Coverage = c.coverage(v, kat)
		case "release":
			j.Release = c.release(v, kat)
		case "pages", "publish":
			// pagesJob below, once artifacts are known.
		case "needs":
			s.needsSet, s.needsPos = true, v.pos
			for _, nd := range c.needs(v, kat) {
				if nd.cross != nil {
					j.CrossNeeds = append(j.CrossNeeds, *nd.cross)
				} else {
					s.needs = append(s.needs, nd)
				}
			}
		case "dependencies":
			s.depsSet = true
			names, _ := c.strList(v, kat, false, true)
			for _, d := range names {
				s.deps = append(s.deps, depSpec{job: d, pos: v.pos})
			}
		case "parallel":
			s.parallel = c.parallel(v, kat)
		case "rules":
			s.rulesSet = true
			s.rules = c.rules(v, kat, ruleJob)
		case "only":
			s.only = c.onlyExcept(v, kat)
		case "except":
			s.except = c.onlyExcept(v, kat)
		case "manual_confirmation":
			c.str(v, kat)
		case "trigger":
			j.Trigger = c.trigger(v, kat)
		case "id_tokens":
			j.IDTokens = c.idTokens(v, kat)
		case "secrets":
			j.Secrets = c.secrets(v, kat)
		case "extends", "inherit":
			// extends is resolved already; inherit above.
		}
	}

	c.pagesJob(s, n, at)
	if x := n.get("release"); j.Release != nil {
		c.checkReleaseDescription(j, x, at+":release")
	}

	if n.get("script") == nil && n.get("trigger") == nil && n.get("run") == nil { // run: has its own error
		// A job without script may be completed by an include that did
		// not load (the same job name there, deep-merged).
		c.unresolved(e.keyPos, "%s config should implement the script: keyword", at)
	}
	if x := n.entry("secrets"); x != nil && len(j.IDTokens) == 0 && slices.ContainsFunc(j.Secrets, func(s Secret) bool {
		return s.Token == "" && (s.Provider() == "vault" || s.Provider() == "azure_key_vault")
	}) {
		// GitLab accepts the file and would log in with CI_JOB_JWT(_V2),
		// which it no longer issues and Berth never did: the job fails when
		// it is handed out (unmet_prerequisites). (gcp_secret_manager names
		// its token; aws_secrets_manager without one uses the runner's own
		// AWS credentials.)
		c.d.warnf(x.keyPos, "%s:secrets: vault and azure_key_vault secrets log in with an ID token: define one in id_tokens (Berth issues no CI_JOB_JWT; the job will fail)", at)
	}
	if s.rulesSet {
		for _, k := range []string{"only", "except"} {
			if x := n.entry(k); x != nil && !x.val.isNull() { // GitLab ignores a null only/except
				c.d.errorf(x.keyPos, "%s config key may not be used with `rules`: %s", at, k)
			}
		}
	}
	// GitLab's default only: [branches, tags] (so not merge request
	// pipelines), which rules or workflow:rules remove (its compose!).
	if !s.rulesSet && !g.workflowSet && s.only == nil && (n.get("only") == nil || n.get("only").isNull()) {
		s.only = defaultOnly
	}
	startIn := n.get("start_in") != nil && !n.get("start_in").isNull() // GitLab ignores a null start_in
	if s.rulesSet && startIn {
		c.d.errorf(n.entry("start_in").keyPos, "%s: start_in may not be used with rules; set it in the rule", at)
	}
	if !s.rulesSet {
		if j.When == Delayed && !startIn {
			c.d.errorf(n.entry("when").val.pos, "%s: when: delayed needs start_in", at)
		}
		if j.When != Delayed && startIn {
			c.d.errorf(n.entry("start_in").keyPos, "%s: start_in is only allowed with when: delayed", at)
		}
	}
	if !s.afSet {
		j.AllowFailure = j.When == Manual
	}
	if s.needsSet {
		j.Scheduling = ScheduleDAG
		// GitLab checks only a non-empty needs: with needs: [] the job
		// starts at once and its dependencies download nothing (below).
		if s.depsSet && len(s.needs) > 0 {
			var missing []string
			for _, d := range s.deps {
				found := false
				for _, nd := range s.needs {
					if nd.job == d.job {
						found = true
					}
				}
				if !found {
					missing = append(missing, d.job)
				}
			}
			if len(missing) > 0 {
				c.d.errorf(n.get("dependencies").pos, "%s:dependencies: %s should be part of needs", at, strings.Join(missing, ", "))
			}
		}
	}

	j.Stage = stage
	s.stagePos = stagePos
	j.StageIndex = indexOf(g.stages, stage)
	if j.StageIndex < 0 {
		c.unresolved(stagePos, "%s: chosen stage %s does not exist; available stages are %s", at, stage, strings.Join(g.stages, ", "))
	}

	s.inheritVars = inheritVars
	if s.rulesSet && !g.workflowSet && len(s.rules) > 0 {
		last := s.rules[len(s.rules)-1]
		if last.onlyWhen && last.when != Never {
			c.d.warnf(last.pos, "%s may allow multiple pipelines to run for a single action due to `rules:when` clause with no `workflow:rules`", at)
		}
	}
	return s
}

// inherit parses inherit:default and inherit:variables.
func (c *compiler) inherit(n *node, at string, g *globals) (func(string) bool, func(string) bool) {
	all := func(string) bool { return true }
	if n.isNull() || !c.mapping(n, at) {
		return all, all
	}
	c.checkKeys(n, at, "default", "variables")
	pick := func(x *node, kat string, known []string) func(string) bool {
		if x == nil || x.isNull() {
			return all
		}
		if x.kind == kScalar {
			b, ok := c.boolean(x, kat)
			if !ok || b {
				return all
			}
			return func(string) bool { return false }
		}
		list, ok := c.strList(x, kat, false, false)
		if !ok {
			return all
		}
		if known != nil {
			for _, k := range list {
				if indexOf(known, k) < 0 {
					c.d.errorf(x.pos, "%s: %q is not a default keyword (allowed: %s)", kat, k, strings.Join(known, ", "))
				}
			}
		}
		return func(k string) bool { return indexOf(list, k) >= 0 }
	}
	return pick(n.get("default"), at+":default", defaultKeys), pick(n.get("variables"), at+":variables", nil)
}

// hooks parses hooks:pre_get_sources_script.
func (c *compiler) hooks(n *node, at string) []string {
	if !c.mapping(n, at) {
		return nil
	}
	c.checkKeys(n, at, "pre_get_sources_script")
	if x := n.get("pre_get_sources_script"); x != nil && !x.isNull() {
		s, _ := c.script(x, at+":pre_get_sources_script")
		return s
	}
	return nil
}

func (c *compiler) needs(n *node, at string) []needSpec {
	if n.kind == kMap {
		// One need written as a mapping: GitLab wraps it in a list.
		n = &node{kind: kSeq, pos: n.pos, seq: []*node{n}}
	}
	if n.kind != kSeq {
		c.d.errorf(n.pos, "%s should be a list (or one mapping), found %s", at, n.describe())
		return nil
	}
	out := []needSpec{}
	var walk func(n *node, depth int)
	walk = func(n *node, depth int) {
		for _, x := range n.seq {
			switch x.kind {
			case kSeq:
				if depth < 10 {
					walk(x, depth+1)
				}
			case kNull:
				// An empty entry (often an anchor of "no needs") is no
				// need, as GitLab reads it.
			case kScalar:
				if s, ok := c.str(x, at); ok {
					out = append(out, needSpec{job: s, artifacts: true, pos: x.pos})
				}
			case kMap:
				if x.get("pipeline") != nil || x.get("project") != nil {
					if cn := c.crossNeed(x, at); cn != nil {
						out = append(out, needSpec{cross: cn, pos: x.pos})
					}
					continue
				}
				c.checkKeys(x, at, "job", "artifacts", "optional", "parallel")
				ns := needSpec{artifacts: true, pos: x.pos}
				jn := x.get("job")
				if jn == nil {
					c.d.errorf(x.pos, "%s: job is required", at)
					continue
				}
				ns.job, _ = c.str(jn, at+":job")
				ns.pos = jn.pos
				if y := x.get("artifacts"); y != nil {
					ns.artifacts, _ = c.boolean(y, at+":artifacts")
				}
				if y := x.get("optional"); y != nil {
					ns.optional, _ = c.boolean(y, at+":optional")
				}
				if y := x.get("parallel"); y != nil {
					ns.matrix = c.needMatrix(y, at+":parallel")
				}
				out = append(out, ns)
			default:
				c.d.errorf(x.pos, "%s: each need should be a job name or a mapping, found %s", at, x.describe())
			}
		}
	}
	walk(n, 0)
	switch {
	case len(out) > c.lim.MaxNeeds:
		c.d.errorf(n.pos, "%s: at most %d needs, found %d", at, c.lim.MaxNeeds, len(out))
	case len(out) > gitlabMaxNeeds:
		c.d.warnf(n.pos, "%s: %d needs: GitLab's default limit (ci_max_needs) is %d; GitLab.com refuses this, self-managed instances may have raised it", at, len(out), gitlabMaxNeeds)
	}
	seen := map[string]bool{}
	for _, nd := range out {
		if nd.matrix != nil || nd.cross != nil {
			continue
		}
		if seen[nd.job] {
			c.d.errorf(nd.pos, "%s: duplicate need: %s", at, nd.job)
		}
		seen[nd.job] = true
	}
	return out
}

// crossNeed parses a need on another pipeline of the hierarchy
// ({pipeline, job, artifacts}) or on another project's latest successful
// job of a ref ({project, job, ref, artifacts}), as GitLab does. They do
// not order the pipeline; the coordinator resolves them when the job is
// queued, with $VARIABLES expanded.
func (c *compiler) crossNeed(x *node, at string) *CrossNeed {
	cn := &CrossNeed{Artifacts: true, Pos: x.pos}
	if x.get("pipeline") != nil {
		c.checkKeys(x, at, "pipeline", "job", "artifacts")
		cn.Pipeline, _ = c.str(x.get("pipeline"), at+":pipeline")
		if cn.Pipeline == "" {
			c.d.errorf(x.get("pipeline").pos, "%s:pipeline should be a pipeline id or a variable such as $PARENT_PIPELINE_ID", at)
			return nil
		}
	} else {
		c.checkKeys(x, at, "project", "job", "ref", "artifacts")
		cn.Project, _ = c.str(x.get("project"), at+":project")
		r := x.get("ref")
		if r == nil {
			c.d.errorf(x.pos, "%s: a need on another project requires ref", at)
			return nil
		}
		cn.Ref, _ = c.str(r, at+":ref")
		if cn.Project == "" || cn.Ref == "" {
			c.d.errorf(x.pos, "%s: project and ref must not be empty", at)
			return nil
		}
	}
	jn := x.get("job")
	if jn == nil && cn.Pipeline != "" {
		c.d.errorf(x.pos, "%s: job is required (a need on a pipeline without job mirrors an upstream project's pipeline status on a bridge job, GitLab Premium's needs:pipeline, which Berth does not support)", at)
		return nil
	}
	if jn == nil {
		c.d.errorf(x.pos, "%s: job is required", at)
		return nil
	}
	if cn.Job, _ = c.str(jn, at+":job"); cn.Job == "" {
		c.d.errorf(jn.pos, "%s:job must not be empty", at)
		return nil
	}
	if y := x.get("artifacts"); y != nil {
		cn.Artifacts, _ = c.boolean(y, at+":artifacts")
	}
	return cn
}

// needMatrix parses needs:parallel:matrix into explicit combinations.
func (c *compiler) needMatrix(n *node, at string) []map[string]string {
	if !c.mapping(n, at) {
		return nil
	}
	c.checkKeys(n, at, "matrix")
	m := n.get("matrix")
	if m == nil {
		c.d.errorf(n.pos, "%s: matrix is required", at)
		return nil
	}
	combos := c.matrix(m, at+":matrix")
	var out []map[string]string
	for _, cmb := range combos {
		mm := map[string]string{}
		for _, v := range cmb {
			mm[v.Key] = v.Value
		}
		out = append(out, mm)
	}
	if out == nil {
		out = []map[string]string{}
	}
	return out
}

func (c *compiler) parallel(n *node, at string) *parallelSpec {
	if n.kind == kScalar {
		v, ok := c.integer(n, at)
		if !ok {
			return nil
		}
		if v < 1 || v > maxParallel {
			c.d.errorf(n.pos, "%s should be between 1 and %d, found %d", at, maxParallel, v)
			return nil
		}
		return &parallelSpec{total: v, pos: n.pos}
	}
	if !c.mapping(n, at) {
		return nil
	}
	c.checkKeys(n, at, "matrix")
	m := n.get("matrix")
	if m == nil {
		c.d.errorf(n.pos, "%s: matrix is required", at)
		return nil
	}
	combos := c.matrix(m, at+":matrix")
	if len(combos) == 0 {
		return nil
	}
	if len(combos) > maxParallel {
		c.d.errorf(m.pos, "%s:matrix generates %d jobs, more than the maximum of %d", at, len(combos), maxParallel)
		return nil
	}
	return &parallelSpec{total: len(combos), combos: combos, pos: m.pos}
}

// matrix expands a matrix list: each entry is the cartesian product of its
// variables' values, the first variable varying slowest, as GitLab does.
func (c *compiler) matrix(n *node, at string) [][]Variable {
	if n.kind != kSeq {
		c.d.errorf(n.pos, "%s should be a list of variable mappings, found %s", at, n.describe())
		return nil
	}
	var out [][]Variable
	for _, entryNode := range n.seq {
		if !c.mapping(entryNode, at) {
			continue
		}
		combos := [][]Variable{{}}
		for _, e := range entryNode.m {
			var vals []*node
			switch e.val.kind {
			case kScalar:
				vals = []*node{e.val}
			case kSeq:
				vals = e.val.seq
			default:
				c.d.errorf(e.val.pos, "%s:%s should be a value or a list of values, found %s", at, e.key, e.val.describe())
				continue
			}
			var next [][]Variable
			for _, cmb := range combos {
				for _, v := range vals {
					s, ok := c.varValue(v, at+":"+e.key)
					if !ok {
						continue
					}
					c.checkIsolationVar(e.key, s, v.pos, at+":"+e.key)
					nc := append(append([]Variable(nil), cmb...), Variable{Key: e.key, Value: s, Pos: v.pos})
					next = append(next, nc)
					if len(out)+len(next) > maxParallel {
						c.d.errorf(n.pos, "%s generates more than the maximum of %d jobs", at, maxParallel)
						return nil
					}
				}
			}
			combos = next
		}
		if len(entryNode.m) == 0 {
			continue
		}
		out = append(out, combos...)
	}
	return out
}

// checkEnvironments checks environment:on_stop targets.
func (c *compiler) checkEnvironments(specs []*jobSpec) {
	by := map[string]*jobSpec{}
	for _, s := range specs {
		by[s.name] = s
	}
	for _, s := range specs {
		env := s.job.Environment
		if env == nil || env.OnStop == "" {
			continue
		}
		t, ok := by[env.OnStop]
		if !ok {
			c.unresolved(s.envPos, "jobs:%s:environment: on_stop job %s is not defined", s.name, env.OnStop)
			continue
		}
		if t.job.Environment == nil || t.job.Environment.Action != "stop" {
			// An include that did not load may define the same job, and
			// its environment:action is merged in unless this file set
			// one.
			c.unresolvedIf(!t.actionSet, s.envPos, "jobs:%s:environment: on_stop job %s needs to have environment with action: stop", s.name, env.OnStop)
		}
	}
}

// instance is one job after parallel expansion.
type instance struct {
	spec     *jobSpec
	job      Job
	matrix   []Variable
	needs    []Need      // statically resolved
	needTo   []*instance // parallel to needs
	needsSet bool        // needs: given (by the job, or by the rule that matched)
	// ruleNeeds are the needs of each rule with rules:needs, resolved;
	// the rule that matches replaces needs and needTo with its own.
	ruleNeeds map[int]resolvedNeeds
	deps      []*instance // explicit dependencies, resolved
	included  bool
}

func (c *compiler) expand(specs []*jobSpec, g *globals) []*instance {
	var out []*instance
	// Names taken by generated instances; a job written with a generated
	// name is GitLab's hash key written twice: the later definition
	// replaces the earlier (its Normalizer builds a hash).
	generated := map[string]Pos{}
	explicit := map[string]int{} // job name → its order, for jobs without parallel
	for _, s := range specs {
		if s.parallel == nil {
			explicit[s.name] = s.order
		}
	}
	for _, s := range specs {
		if s.parallel == nil {
			if _, dup := generated[s.name]; dup {
				c.d.warnf(s.pos, "job %q has the name of a parallel job's instance defined before it: it replaces that instance, as in GitLab", s.name)
				out = slices.DeleteFunc(out, func(in *instance) bool { return in.job.Name == s.name })
			}
			out = append(out, &instance{spec: s, job: s.job})
			continue
		}
		for i := 0; i < s.parallel.total; i++ {
			in := &instance{spec: s, job: s.job}
			in.job.NodeIndex, in.job.NodeTotal = i+1, s.parallel.total
			if s.parallel.combos == nil {
				in.job.Name = fmt.Sprintf("%s %d/%d", s.name, i+1, s.parallel.total)
			} else {
				in.matrix = s.parallel.combos[i]
				vals := make([]string, len(in.matrix))
				for k, v := range in.matrix {
					vals[k] = v.Value
				}
				in.job.Name = fmt.Sprintf("%s: [%s]", s.name, strings.Join(vals, ", "))
				in.job.Matrix = in.matrix
			}
			if p, dup := generated[in.job.Name]; dup {
				c.d.errorf(s.parallel.pos, "jobs:%s:parallel: generated job name %q is already used (at %s)", s.name, in.job.Name, p)
				continue
			}
			generated[in.job.Name] = s.parallel.pos
			if o, dup := explicit[in.job.Name]; dup {
				if o > s.order {
					continue // the job written later replaces this instance (warned there)
				}
				c.d.warnf(s.parallel.pos, "jobs:%s:parallel: generated job name %q replaces the job of that name defined before it, as in GitLab", s.name, in.job.Name)
				out = slices.DeleteFunc(out, func(x *instance) bool { return x.spec.parallel == nil && x.job.Name == in.job.Name })
			}
			out = append(out, in)
		}
		if len(out) > c.lim.maxDefinedJobs() {
			c.d.errorf(s.pos, "the configuration defines more than %d jobs (after parallel expansion, before rules)", c.lim.maxDefinedJobs())
			return nil
		}
	}
	sortInstances(out)
	return out
}

// staticGraph resolves needs and dependencies to expanded jobs and checks
// them like GitLab's YAML processor: they must exist, be in the same or an
// earlier stage, and needs must not form a cycle.
func (c *compiler) staticGraph(insts []*instance) {
	byName := map[string]*instance{}
	byBase := map[string][]*instance{}
	parallel := map[string]bool{}
	for _, in := range insts {
		byName[in.job.Name] = in
		byBase[in.spec.name] = append(byBase[in.spec.name], in)
		if in.spec.parallel != nil {
			parallel[in.spec.name] = true
		}
	}
	lookup := func(name string) []*instance {
		if parallel[name] {
			return byBase[name]
		}
		if in, ok := byName[name]; ok {
			return []*instance{in}
		}
		return nil
	}
	for _, in := range insts {
		s := in.spec
		at := "jobs:" + s.name
		in.needsSet = s.needsSet
		in.needs, in.needTo = c.resolveNeeds(in, s.needs, at, lookup, byBase)
		for k, r := range s.rules {
			if r.needsSet {
				if in.ruleNeeds == nil {
					in.ruleNeeds = map[int]resolvedNeeds{}
				}
				rn := resolvedNeeds{}
				rn.needs, rn.to = c.resolveNeeds(in, r.needs, at+":rules", lookup, byBase)
				in.ruleNeeds[k] = rn
			}
		}
		for _, d := range s.deps {
			targets := lookup(d.job)
			if len(targets) == 0 {
				c.unresolved(d.pos, "%s:dependencies: undefined dependency: %s", at, d.job)
				continue
			}
			for _, t := range targets {
				if t.job.StageIndex > in.job.StageIndex {
					c.unresolved(d.pos, "%s:dependencies: dependency %s is not defined in current or prior stages", at, t.job.Name)
					if !c.incomplete {
						continue
					}
				}
				in.deps = append(in.deps, t)
			}
		}
	}
	c.needCycles(insts)
}

// needCycles reports a cycle of needs (at most one), as GitLab does.
// Cycles can only run through jobs of one stage.
func (c *compiler) needCycles(insts []*instance) {
	const (
		white = iota
		grey
		black
	)
	color := map[*instance]int{}
	var path []*instance
	var visit func(in *instance) bool
	visit = func(in *instance) bool {
		color[in] = grey
		path = append(path, in)
		for i, t := range in.needTo {
			switch color[t] {
			case grey:
				start := 0
				for k, p := range path {
					if p == t {
						start = k
					}
				}
				var names []string
				for _, p := range path[start:] {
					names = append(names, p.job.Name)
				}
				names = append(names, t.job.Name)
				c.d.errorf(in.needs[i].Pos, "jobs:%s:needs: circular dependency: %s", in.spec.name, strings.Join(names, " → "))
				return false
			case white:
				if !visit(t) {
					return false
				}
			}
		}
		path = path[:len(path)-1]
		color[in] = black
		return true
	}
	for _, in := range insts {
		if color[in] == white {
			path = path[:0]
			if !visit(in) {
				return
			}
		}
	}
}

// resolvedNeeds are needs resolved to instances (parallel slices).
type resolvedNeeds struct {
	needs []Need
	to    []*instance
}

// resolveNeeds resolves the needs of instance in to the instances they
// name, checking that they exist and are in the same or an earlier stage.
func (c *compiler) resolveNeeds(in *instance, specs []needSpec, at string, lookup func(string) []*instance, byBase map[string][]*instance) ([]Need, []*instance) {
	var needs []Need
	var to []*instance
	for _, nd := range specs {
		var targets []*instance
		if nd.matrix != nil {
			combos, ok := c.matrixExpressions(nd, in, at)
			if !ok {
				continue
			}
			for _, t := range byBase[nd.job] {
				for _, want := range combos {
					if matrixMatches(t.matrix, want) {
						targets = append(targets, t)
						break
					}
				}
			}
		} else {
			targets = lookup(nd.job)
		}
		if len(targets) == 0 {
			if !nd.optional {
				what := nd.job
				if nd.matrix != nil {
					what += " with the given parallel:matrix values"
				}
				c.unresolved(nd.pos, "%s:needs: undefined need: %s", at, what)
			}
			continue
		}
		for _, t := range targets {
			if t.job.StageIndex > in.job.StageIndex {
				// A missing include may set the stages, or the stage
				// of a job through a template it extends.
				c.unresolved(nd.pos, "%s:needs: need %s is not defined in current or prior stages (it is in stage %s, after %s)", at, t.job.Name, t.job.Stage, in.job.Stage)
				if !c.incomplete {
					continue
				}
			}
			needs = append(needs, Need{Job: t.job.Name, Artifacts: nd.artifacts, Optional: nd.optional, Pos: nd.pos})
			to = append(to, t)
		}
	}
	return needs, to
}

var matrixExprRe = regexp.MustCompile(`\$\[\[\s*matrix\.([a-zA-Z0-9_-]+)\s*\]\]`)

// matrixExpressions replaces $[[ matrix.NAME ]] in a need's
// parallel:matrix values with the needing instance's own matrix value
// (GitLab 18.3's 1:1 matrix needs), so each instance needs its match.
func (c *compiler) matrixExpressions(nd needSpec, in *instance, at string) ([]map[string]string, bool) {
	out := make([]map[string]string, 0, len(nd.matrix))
	for _, combo := range nd.matrix {
		m := make(map[string]string, len(combo))
		for k, v := range combo {
			var bad string
			m[k] = matrixExprRe.ReplaceAllStringFunc(v, func(b string) string {
				name := matrixExprRe.FindStringSubmatch(b)[1]
				for _, mv := range in.matrix {
					if mv.Key == name {
						return mv.Value
					}
				}
				bad = name
				return b
			})
			if bad != "" {
				// A template from a missing include may give the job its matrix.
				c.unresolved(nd.pos, "%s:needs: $[[ matrix.%s ]]: %s has no parallel:matrix variable %s", at, bad, in.job.Name, bad)
				return nil, false
			}
		}
		out = append(out, m)
	}
	return out, true
}

func matrixMatches(have []Variable, want map[string]string) bool {
	if len(have) != len(want) {
		return false
	}
	for _, v := range have {
		w, ok := want[v.Key]
		if !ok || w != v.Value {
			return false
		}
	}
	return true
}

// evalRules applies rules to every instance: when, allow_failure,
// start_in, interruptible and variables.
func (c *compiler) evalRules(insts []*instance, g *globals, wfVars []Variable) {
	total := 0
	ruleNeeds := false // a matched rule replaced needs
	for _, in := range insts {
		s := in.spec
		j := &in.job
		// Workflow rules variables join the global variables, and the job
		// inherits from both what inherit:variables lets through.
		var globalVars []Variable
		for _, v := range mergeVars(g.vars, wfVars) {
			if s.inheritVars(v.Key) {
				globalVars = append(globalVars, v)
			}
		}
		j.Variables = mergeVars(globalVars, s.jobVars, in.matrix)
		total += len(j.Variables)
		if total > c.lim.MaxNodes {
			c.d.errorf(s.pos, "jobs and their variables expand to more than %d values", c.lim.MaxNodes)
			return
		}
		j.Rules = RulesOutcome{Defined: s.rulesSet, Matched: -1}
		extra := jobRulesVariables(j)
		if j.Environment != nil && (s.rulesSet || s.only != nil || s.except != nil) {
			addEnvironment(extra, j.Environment, c.layer(extra, j.Variables))
		}
		if !s.rulesSet {
			in.included = true
			if s.only != nil || s.except != nil {
				vars := c.layer(extra, j.Variables)
				switch {
				case s.only != nil && !c.matchOnly(s.only, vars):
					j.When, in.included, j.Rules.Filter = Never, false, "only did not match"
				case s.except != nil && c.matchExcept(s.except, vars):
					j.When, in.included, j.Rules.Filter = Never, false, "except matched"
				case s.only == defaultOnly && s.except == nil:
					// GitLab's default only let it in: as a job without filters.
				default:
					j.Rules.Filter = "only/except let it in"
				}
				if c.ioErr != nil {
					return
				}
			}
			continue
		}
		vars := c.layer(extra, j.Variables)
		i := c.firstMatch(s.rules, vars)
		if c.ioErr != nil {
			return
		}
		if i < 0 {
			j.When = Never
			continue
		}
		r := s.rules[i]
		j.Rules.Matched, j.Rules.Pos = i, r.pos
		if r.needsSet {
			rn := in.ruleNeeds[i]
			in.needs, in.needTo, in.needsSet = rn.needs, rn.to, true
			j.Scheduling = ScheduleDAG
			ruleNeeds = true
		}
		if r.whenSet {
			j.When = r.when
		}
		if r.allowFailure != nil {
			j.AllowFailure = *r.allowFailure
		}
		if r.startInSet {
			j.StartIn = r.startIn
		}
		if r.interrupt != nil {
			j.Interruptible = *r.interrupt
		}
		j.Variables = mergeVars(j.Variables, r.variables)
		in.included = j.When != Never
	}
	if ruleNeeds {
		c.needCycles(insts)
	}
}

// finalGraph drops excluded jobs, checks needs against what is left and
// computes dependencies.
func (c *compiler) finalGraph(insts []*instance, p *Pipeline) {
	bridges := map[string]bool{}
	for _, in := range insts {
		if in.job.Trigger != nil {
			bridges[in.job.Name] = true
		}
	}
	for _, in := range insts {
		if !in.included {
			j := in.job
			j.Needs = in.needs
			p.Excluded = append(p.Excluded, &j)
		}
	}
	for _, in := range insts {
		if !in.included {
			continue
		}
		j := &in.job
		at := "jobs:" + in.spec.name
		j.Isolation = c.jobIsolation(in.spec.isolation, j.Variables)
		if in.needsSet {
			j.Needs = []Need{}
			for i, nd := range in.needs {
				if in.needTo[i].included {
					j.Needs = append(j.Needs, nd)
					continue
				}
				if !nd.Optional {
					// A missing include may set the variables the rules read.
					c.unresolved(nd.Pos, "%s:needs: %s needs %s, but %s is not in the pipeline (its rules or only/except exclude it); use optional: true", at, j.Name, nd.Job, nd.Job)
				}
			}
		}
		switch {
		case in.spec.depsSet:
			// With needs, GitLab downloads from the needs with artifacts
			// that dependencies names (Ci::BuildDependencies#from_needs).
			fromNeeds := map[string]bool{}
			for _, nd := range j.Needs {
				fromNeeds[nd.Job] = nd.Artifacts
			}
			j.Dependencies = []string{}
			for _, d := range in.deps {
				if d.included && (!in.needsSet || fromNeeds[d.job.Name]) {
					j.Dependencies = append(j.Dependencies, d.job.Name)
				}
			}
		case in.needsSet:
			for _, nd := range j.Needs {
				// A trigger job has no artifacts to download.
				if nd.Artifacts && !bridges[nd.Job] {
					j.Dependencies = append(j.Dependencies, nd.Job)
				}
			}
		default:
			for _, o := range insts {
				if o.included && o.job.StageIndex < j.StageIndex && o.job.Trigger == nil {
					j.Dependencies = append(j.Dependencies, o.job.Name)
				}
			}
		}
		if j.Trigger != nil {
			// A bridge runs nowhere. It downloads nothing, but reads its
			// dependencies' dotenv reports, as GitLab's
			// Ci::Processable#dependency_variables does for any job.
			j.Isolation = ""
		}
		jj := *j
		jj.Cache = append([]Cache(nil), j.Cache...) // keys are resolved per job
		p.Jobs = append(p.Jobs, &jj)
	}
	p.Created = false
	for _, j := range p.Jobs {
		if j.Stage != ".pre" && j.Stage != ".post" {
			p.Created = true
		}
	}
	if !p.Created {
		if len(p.Jobs) == 0 {
			p.Reason = "no job is left after rules"
		} else {
			p.Reason = "only jobs in .pre or .post stages are left after rules"
		}
	}
}

// Slug is GitLab's slugify, as CI_JOB_NAME_SLUG and the other *_SLUG
// variables use it: lower case, every character but a-z and 0-9 a dash,
// at most max bytes, no dash at either end.
func Slug(s string, max int) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	if len(b) > max {
		b = b[:max]
	}
	return strings.Trim(string(b), "-")
}

// jobRulesVariables are the job's own predefined variables that its rules
// and only/except see, as GitLab's scoped_variables_for_pipeline_seed
// gives them: CI_JOB_NAME, CI_JOB_STAGE and OwnVariables (CI_JOB_MANUAL
// by the job's when before rules); with an environment, addEnvironment
// adds its own.
func jobRulesVariables(j *Job) map[string]string {
	extra := map[string]string{"CI_JOB_NAME": j.Name, "CI_JOB_STAGE": j.Stage}
	for _, v := range j.OwnVariables() {
		extra[v.Key] = v.Value
	}
	return extra
}

// addEnvironment adds a job's environment variables to extra: the name
// expanded with the variables the rules see (vars), as GitLab expands it
// first; like the other predefined variables, the file's own variables of
// those names win.
func addEnvironment(extra map[string]string, e *Environment, vars map[string]string) {
	name := strings.TrimSpace(expandVars(e.Name, vars))
	if name == "" {
		return
	}
	extra["CI_ENVIRONMENT_NAME"] = name
	extra["CI_ENVIRONMENT_ACTION"] = cmp.Or(e.Action, "start")
	if e.DeploymentTier != "" {
		extra["CI_ENVIRONMENT_TIER"] = e.DeploymentTier
	}
	if e.URL != "" {
		extra["CI_ENVIRONMENT_URL"] = e.URL
	}
}
