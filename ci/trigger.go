package ci

import (
	"encoding/json"
	"strings"
)

// maxTriggerIncludes is GitLab's limit on trigger:include entries
// (SameProjectTrigger::INCLUDE_MAX_SIZE).
const maxTriggerIncludes = 3

// bridgeKeys are the keywords a trigger job (a bridge) may have: GitLab's
// PROCESSABLE_ALLOWED_KEYS (interruptible included since GitLab 16) plus trigger, and the parallel and environment
// keywords its documentation lists for trigger jobs.
var bridgeKeys = []string{"allow_failure", "environment", "except", "extends", "inherit", "interruptible", "needs", "only",
	"parallel", "resource_group", "rules", "stage", "trigger", "variables", "when"}

// Trigger is a job's trigger keyword: the job is a bridge that creates a
// downstream pipeline instead of running on a runner. Either Include is
// set (a child pipeline of the same project, at the same commit) or
// Project (a multi-project pipeline).
type Trigger struct {
	// Project is the downstream project's full path (multi-project).
	// $VARIABLES in it are expanded with the bridge's variables when the
	// downstream pipeline is created.
	Project string `json:"project,omitempty"`
	// Branch is the downstream ref (multi-project; default: the
	// project's default branch), expanded like Project.
	Branch string `json:"branch,omitempty"`
	// Include lists the child pipeline's configuration files (at most 3).
	Include []TriggerInclude `json:"include,omitempty"`
	// Strategy is "" (the bridge succeeds once the downstream pipeline is
	// created), "depend" (it ends as the downstream pipeline ends) or
	// "mirror" (it shows the downstream pipeline's status, manual and
	// skipped included).
	Strategy string `json:"strategy,omitempty"`
	// Inputs are trigger:inputs (multi-project): the downstream
	// configuration's spec:inputs, as a pipeline's inputs.
	Inputs map[string]any `json:"inputs,omitempty"`
	// ForwardYAMLVariables passes the bridge's YAML variables downstream
	// (forward:yaml_variables, default true); ForwardPipelineVariables
	// passes the upstream pipeline's variables (default false).
	ForwardYAMLVariables     bool `json:"forward_yaml_variables"`
	ForwardPipelineVariables bool `json:"forward_pipeline_variables"`
}

// Child reports whether the trigger creates a child pipeline.
func (t *Trigger) Child() bool { return t != nil && len(t.Include) > 0 }

// TriggerInclude is one trigger:include entry. Exactly one of Local,
// Remote, Template, Artifact, Project and Component is set; Entry is the
// entry as written (a string or a mapping), to become the child
// configuration's include: unchanged, except that an Artifact entry is
// replaced by a local one naming the extracted file.
type TriggerInclude struct {
	Local     string   `json:"local,omitempty"`
	Remote    string   `json:"remote,omitempty"`
	Template  string   `json:"template,omitempty"`
	Artifact  string   `json:"artifact,omitempty"`
	Job       string   `json:"job,omitempty"` // with Artifact: the job of the parent pipeline whose artifacts hold it
	Project   string   `json:"project,omitempty"`
	Ref       string   `json:"ref,omitempty"`
	File      []string `json:"file,omitempty"`
	Component string   `json:"component,omitempty"`
	Entry     any      `json:"entry"`
	Pos       Pos      `json:"pos"`
}

// ExpandVariables expands $VAR and ${VAR} in s with vars (unknown
// variables expand to ""; $$ is a dollar), as the trigger's project and
// branch are expanded.
func ExpandVariables(s string, vars map[string]string) string { return expandVars(s, vars) }

// trigger parses the trigger keyword: a project path, or a mapping.
func (c *compiler) trigger(n *node, at string) *Trigger {
	t := &Trigger{ForwardYAMLVariables: true}
	if n.kind == kScalar {
		s, ok := c.str(n, at)
		if !ok {
			return nil
		}
		if strings.TrimSpace(s) == "" {
			c.d.errorf(n.pos, "%s can't be blank", at)
			return nil
		}
		t.Project = s
		return t
	}
	if n.kind != kMap {
		c.d.errorf(n.pos, "%s has to be either a string or a hash, found %s", at, n.describe())
		return nil
	}
	if len(n.m) == 0 {
		c.d.errorf(n.pos, "%s can't be blank", at)
		return nil
	}
	child := n.get("include") != nil
	if child {
		c.checkKeys(n, at, "include", "strategy", "forward")
	} else {
		c.checkKeys(n, at, "project", "branch", "strategy", "forward", "inputs")
		if x := n.get("inputs"); x != nil && !x.isNull() && c.mapping(x, at+":inputs") {
			t.Inputs, _ = x.value().(map[string]any)
		}
		x := n.get("project")
		if x == nil {
			c.d.errorf(n.pos, "%s config must specify either project or include", at)
			return nil
		}
		if s, ok := c.str(x, at+":project"); ok {
			if strings.TrimSpace(s) == "" {
				c.d.errorf(x.pos, "%s:project can't be blank", at)
			}
			t.Project = s
		}
		if x := n.get("branch"); x != nil && !x.isNull() {
			t.Branch, _ = c.str(x, at+":branch")
		}
	}
	if x := n.get("strategy"); x != nil && !x.isNull() {
		t.Strategy, _ = c.oneOf(x, at+":strategy", "depend", "mirror")
	}
	if x := n.get("forward"); x != nil && !x.isNull() && c.mapping(x, at+":forward") {
		c.checkKeys(x, at+":forward", "yaml_variables", "pipeline_variables")
		if y := x.get("yaml_variables"); y != nil {
			t.ForwardYAMLVariables, _ = c.boolean(y, at+":forward:yaml_variables")
		}
		if y := x.get("pipeline_variables"); y != nil {
			t.ForwardPipelineVariables, _ = c.boolean(y, at+":forward:pipeline_variables")
		}
	}
	if child {
		t.Include = c.triggerIncludes(n.get("include"), at+":include")
	}
	return t
}

// triggerIncludes parses trigger:include: a path, one mapping or a list
// of at most three.
func (c *compiler) triggerIncludes(n *node, at string) []TriggerInclude {
	items := []*node{n}
	switch n.kind {
	case kSeq:
		items = n.seq
		if len(items) > maxTriggerIncludes {
			c.d.errorf(n.pos, "%s config is too long (maximum is %d)", at, maxTriggerIncludes)
		}
	case kNull:
		c.d.errorf(n.pos, "%s can't be blank", at)
		return nil
	}
	var out []TriggerInclude
	for _, x := range items {
		switch x.kind {
		case kScalar:
			s, ok := c.str(x, at)
			if !ok {
				continue
			}
			inc := TriggerInclude{Entry: s, Pos: x.pos}
			if strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://") {
				inc.Remote = s
			} else {
				inc.Local = s
			}
			out = append(out, inc)
		case kMap:
			if inc, ok := c.triggerInclude(x, at); ok {
				out = append(out, inc)
			}
		default:
			c.d.errorf(x.pos, "%s: each entry should be a string or a mapping, found %s", at, x.describe())
		}
	}
	return out
}

// triggerInclude parses one mapping of trigger:include. The keys are
// those of include: (what they mean in the child is the child
// configuration's business), plus artifact and job.
func (c *compiler) triggerInclude(x *node, at string) (TriggerInclude, bool) {
	c.checkKeys(x, at, "local", "remote", "template", "artifact", "job", "project", "ref", "file", "component",
		"inputs", "rules", "cache", "integrity")
	inc := TriggerInclude{Pos: x.pos, Entry: x.value()}
	var kinds []string
	for _, k := range []string{"local", "remote", "template", "artifact", "project", "component"} {
		if x.get(k) != nil {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) != 1 {
		c.d.errorf(x.pos, "%s: each entry needs exactly one of local, remote, template, artifact, project or component, found %s", at, describeKinds(kinds))
		return inc, false
	}
	strField := func(k string) string {
		y := x.get(k)
		if y == nil {
			return ""
		}
		s, ok := c.str(y, at+":"+k)
		if ok && strings.TrimSpace(s) == "" {
			c.d.errorf(y.pos, "%s:%s can't be blank", at, k)
		}
		return s
	}
	inc.Local, inc.Remote, inc.Template = strField("local"), strField("remote"), strField("template")
	inc.Artifact, inc.Project, inc.Component = strField("artifact"), strField("project"), strField("component")
	switch kinds[0] {
	case "artifact":
		if x.get("job") == nil {
			c.d.errorf(x.pos, "%s: job must be provided when including configs from artifacts", at)
			return inc, false
		}
		inc.Job = strField("job")
	case "project":
		if x.get("file") == nil {
			c.d.errorf(x.pos, "%s: file is required with project", at)
			return inc, false
		}
		inc.File, _ = c.strList(x.get("file"), at+":file", true, false)
		if y := x.get("ref"); y != nil {
			inc.Ref, _ = c.str(y, at+":ref")
		}
	}
	if kinds[0] != "artifact" && x.get("job") != nil {
		c.d.errorf(x.entry("job").keyPos, "%s: job is only allowed with artifact", at)
	}
	if kinds[0] != "project" {
		for _, k := range []string{"ref", "file"} {
			if e := x.entry(k); e != nil {
				c.d.errorf(e.keyPos, "%s: %s is only allowed with project", at, k)
			}
		}
	}
	return inc, true
}

func describeKinds(kinds []string) string {
	if len(kinds) == 0 {
		return "none"
	}
	return strings.Join(kinds, " and ")
}

// checkTriggerArtifacts checks include:artifact jobs: the job must be in
// the pipeline and finish before the bridge starts, so it must be one of
// the bridge's needs, or, for a bridge without needs, in an earlier stage.
func (c *compiler) checkTriggerArtifacts(insts []*instance) {
	byName := map[string][]*instance{}
	for _, in := range insts {
		byName[in.job.Name] = append(byName[in.job.Name], in)
		if in.job.Name != in.spec.name {
			byName[in.spec.name] = append(byName[in.spec.name], in)
		}
	}
	seen := map[*jobSpec]bool{}
	for _, in := range insts {
		t := in.job.Trigger
		if t == nil || seen[in.spec] {
			continue
		}
		seen[in.spec] = true
		at := "jobs:" + in.spec.name + ":trigger:include"
		for _, inc := range t.Include {
			if inc.Artifact == "" || inc.Job == "" {
				continue
			}
			targets := byName[inc.Job]
			if len(targets) == 0 {
				c.unresolved(inc.Pos, "%s: artifact job %s is not defined", at, inc.Job)
				continue
			}
			for _, t := range targets {
				// GitLab asks for an earlier stage, needs or not; a job in
				// needs runs before too.
				before := t.job.StageIndex < in.job.StageIndex
				for _, to := range in.needTo {
					before = before || to == t
				}
				if !before {
					// Stages may come from an include that failed.
					c.unresolved(inc.Pos, "%s: artifact job %s must run before %s: it must be in an earlier stage or in needs", at, t.job.Name, in.spec.name)
					break
				}
			}
		}
	}
}

// value turns a node into plain Go values (string, bool, json.Number,
// []any, map[string]any, nil) that encode to JSON, which is YAML.
func (n *node) value() any {
	if n == nil {
		return nil
	}
	switch n.kind {
	case kMap:
		m := make(map[string]any, len(n.m))
		for _, e := range n.m {
			m[e.key] = e.val.value()
		}
		return m
	case kSeq, kRef:
		s := make([]any, 0, len(n.seq))
		for _, x := range n.seq {
			s = append(s, x.value())
		}
		return s
	case kScalar:
		if b, ok := yaml11Bool(n); ok && n.tag == "!!bool" {
			return b
		}
		if n.tag == "!!int" || n.tag == "!!float" {
			if json.Valid([]byte(n.str)) {
				return json.Number(n.str)
			}
		}
		return n.str
	}
	return nil
}
