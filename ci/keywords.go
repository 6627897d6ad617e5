package ci

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// variables parses a variables mapping. Global variables may carry a
// description and options (to prefill manual pipelines); job variables
// only value and expand, as in GitLab.
func (c *compiler) variables(n *node, at string, global bool) []Variable {
	if !c.mapping(n, at) {
		return nil
	}
	var out []Variable
	for _, e := range n.m {
		vat := at + ":" + e.key
		v := Variable{Key: e.key, Pos: e.keyPos}
		if e.key == "" {
			c.d.errorf(e.keyPos, "%s: variable name is empty", at)
			continue
		}
		switch e.val.kind {
		case kScalar, kNull:
			val, ok := c.varValue(e.val, vat)
			if !ok {
				continue
			}
			v.Value = val
			c.checkIsolationVar(e.key, val, e.val.pos, vat)
		case kMap:
			known := []string{"value", "expand"}
			if global {
				known = append(known, "description", "options")
			}
			c.checkKeys(e.val, vat, known...)
			if x := e.val.get("value"); x != nil {
				v.Value, _ = c.varValue(x, vat+":value")
				c.checkIsolationVar(e.key, v.Value, x.pos, vat+":value")
			}
			if x := e.val.get("expand"); x != nil {
				b, _ := c.boolean(x, vat+":expand")
				v.Raw = !b
			}
			if x := e.val.get("description"); x != nil && global {
				v.Description, _ = c.str(x, vat+":description")
			}
			if x := e.val.get("options"); x != nil && global {
				v.Options, _ = c.strList(x, vat+":options", false, false)
				if x.kind == kSeq && len(x.seq) == len(v.Options) {
					// Read as the value is: an unquoted 3.10 is 3.1 in both.
					for i, o := range x.seq {
						if o.kind == kScalar && o.plain {
							v.Options[i], _ = psychScalar(o.str)
						}
					}
				}
				if len(v.Options) > 0 && indexOf(v.Options, v.Value) < 0 {
					c.d.errorf(x.pos, "%s: value %q must be one of the options", vat, v.Value)
				}
			}
		default:
			c.d.errorf(e.val.pos, "%s should be a string, a number or a mapping with value, found %s", vat, e.val.describe())
			continue
		}
		out = append(out, v)
	}
	return out
}

// varValue is a variable's value as GitLab stores it: strings as written;
// unquoted numbers as Ruby reads and prints them (3.10 is 3.1, 0755 is
// 493: psychScalar), with a warning when that is not the text written;
// booleans (YAML 1.1's yes/no/on/off included, as Ruby reads them) as
// "true" or "false", null as the empty string.
func (c *compiler) varValue(n *node, at string) (string, bool) {
	if n.kind == kNull {
		return "", true
	}
	if b, isBool := yaml11Bool(n); isBool {
		return strconv.FormatBool(b), true
	}
	if n.kind != kScalar {
		c.d.errorf(n.pos, "%s should be a string, a number or a boolean, found %s", at, n.describe())
		return "", false
	}
	if !n.plain {
		return n.str, true // quoted, a block scalar, or tagged: a string
	}
	v, kind := psychScalar(n.str)
	switch {
	case kind == psychValue && v != n.str:
		c.d.warnf(n.pos, "%s: GitLab reads the unquoted %s as %s; quote it to keep it as written", at, n.str, v)
	case kind == psychDate:
		c.d.warnf(n.pos, "%s: GitLab refuses the unquoted date or time %s (its YAML loader allows no Date); quote it", at, n.str)
	case kind == psychError:
		c.d.warnf(n.pos, "%s: GitLab's YAML loader fails on the unquoted %s; quote it", at, n.str)
	}
	return v, true
}

// simpleVariables parses rules:variables and workflow:rules:variables:
// name to string.
func (c *compiler) simpleVariables(n *node, at string) []Variable {
	if !c.mapping(n, at) {
		return nil
	}
	var out []Variable
	for _, e := range n.m {
		val, ok := c.varValue(e.val, at+":"+e.key)
		if ok {
			out = append(out, Variable{Key: e.key, Value: val, Pos: e.keyPos})
		}
	}
	return out
}

var pullPolicies = []string{"always", "never", "if-not-present"}

// image parses image, or one service when service is true.
func (c *compiler) image(n *node, at string, service bool) *Image {
	if n.kind == kScalar {
		s, ok := c.str(n, at)
		if !ok {
			return nil
		}
		if s == "" {
			c.d.errorf(n.pos, "%s: name is empty", at)
			return nil
		}
		return &Image{Name: s}
	}
	if !c.mapping(n, at) {
		return nil
	}
	known := []string{"name", "entrypoint", "pull_policy", "docker", "kubernetes"}
	if service {
		known = append(known, "alias", "command", "variables")
	}
	c.checkKeys(n, at, known...)
	img := &Image{}
	if x := n.get("name"); x != nil {
		img.Name, _ = c.str(x, at+":name")
	}
	if img.Name == "" {
		c.d.errorf(n.pos, "%s: name is required", at)
	}
	if x := n.get("entrypoint"); x != nil {
		img.Entrypoint, _ = c.strList(x, at+":entrypoint", false, false)
	}
	if x := n.get("command"); x != nil && service {
		img.Command, _ = c.strList(x, at+":command", false, false)
	}
	if x := n.get("alias"); x != nil && service {
		img.Alias, _ = c.str(x, at+":alias")
	}
	if x := n.get("variables"); x != nil && service {
		img.Variables = c.simpleVariables(x, at+":variables")
	}
	if x := n.get("pull_policy"); x != nil {
		pp, ok := c.strList(x, at+":pull_policy", true, false)
		if ok {
			for _, p := range pp {
				if indexOf(pullPolicies, p) < 0 {
					c.d.errorf(x.pos, "%s:pull_policy should be always, never or if-not-present, found %q", at, p)
				}
			}
			img.PullPolicy = pp
		}
	}
	if x := n.get("docker"); x != nil && c.mapping(x, at+":docker") {
		c.checkKeys(x, at+":docker", "platform", "user")
		if y := x.get("platform"); y != nil {
			img.DockerPlatform, _ = c.str(y, at+":docker:platform")
		}
		if y := x.get("user"); y != nil {
			img.DockerUser, _ = c.str(y, at+":docker:user")
		}
	}
	if x := n.get("kubernetes"); x != nil && c.mapping(x, at+":kubernetes") {
		c.checkKeys(x, at+":kubernetes", "user")
		if y := x.get("user"); y != nil {
			img.KubernetesUser, _ = c.str(y, at+":kubernetes:user")
		}
	}
	return img
}

func (c *compiler) services(n *node, at string) []Image {
	if n.kind != kSeq {
		c.d.errorf(n.pos, "%s should be a list of services, found %s", at, n.describe())
		return nil
	}
	var out []Image
	var walk func(n *node)
	walk = func(n *node) {
		for i, x := range n.seq {
			if x.kind == kSeq { // from !reference
				walk(x)
				continue
			}
			if img := c.image(x, at+":"+strconv.Itoa(i), true); img != nil {
				out = append(out, *img)
			}
		}
	}
	walk(n)
	return out
}

// reportFormats maps artifacts:reports types to the runner payload's
// artifact_format and default file name, as GitLab's Ci::JobArtifact.
var reportFormats = map[string]struct{ format, file string }{
	"junit":                  {"gzip", "junit.xml"},
	"dotenv":                 {"gzip", ".env"},
	"cobertura":              {"gzip", "cobertura-coverage.xml"},
	"jacoco":                 {"gzip", "jacoco.xml"},
	"metrics":                {"gzip", "metrics.txt"},
	"cyclonedx":              {"gzip", "gl-sbom.cdx.json"},
	"annotations":            {"gzip", "gl-annotations.json"},
	"repository_xray":        {"gzip", "gl-repository-xray.json"},
	"codequality":            {"raw", "gl-code-quality-report.json"},
	"sast":                   {"raw", "gl-sast-report.json"},
	"secret_detection":       {"raw", "gl-secret-detection-report.json"},
	"dependency_scanning":    {"raw", "gl-dependency-scanning-report.json"},
	"container_scanning":     {"raw", "gl-container-scanning-report.json"},
	"cluster_image_scanning": {"raw", "gl-cluster-image-scanning-report.json"},
	"dast":                   {"raw", "gl-dast-report.json"},
	"license_scanning":       {"raw", "gl-license-scanning-report.json"},
	"accessibility":          {"raw", "gl-accessibility.json"},
	"performance":            {"raw", "performance.json"},
	"browser_performance":    {"raw", "browser-performance.json"},
	"load_performance":       {"raw", "load-performance.json"},
	"terraform":              {"raw", "tfplan.json"},
	"requirements":           {"raw", "requirements.json"},
	"requirements_v2":        {"raw", "requirements_v2.json"},
	"coverage_fuzzing":       {"raw", "gl-coverage-fuzzing-report.json"},
	"api_fuzzing":            {"raw", "gl-api-fuzzing-report.json"},
	"lsif":                   {"zip", "lsif.json"}, // code intelligence
}

func (c *compiler) artifacts(n *node, at string) *Artifacts {
	if !c.mapping(n, at) {
		return nil
	}
	n = n.withoutNulls()
	c.checkKeys(n, at, "paths", "exclude", "untracked", "when", "expire_in", "name", "reports", "expose_as", "public", "access")
	a := &Artifacts{When: OnSuccess}
	if x := n.get("paths"); x != nil {
		a.Paths, _ = c.strList(x, at+":paths", false, true)
	}
	if x := n.get("exclude"); x != nil {
		a.Exclude, _ = c.strList(x, at+":exclude", false, true)
	}
	if x := n.get("untracked"); x != nil {
		a.Untracked, _ = c.boolean(x, at+":untracked")
	}
	if x := n.get("when"); x != nil {
		w, _ := c.oneOf(x, at+":when", "on_success", "on_failure", "always")
		a.When = When(w)
	}
	if x := n.get("expire_in"); x != nil {
		if s, ok := c.str(x, at+":expire_in"); ok {
			if s != "never" {
				if _, err := ParseDuration(s); err != nil {
					c.d.errorf(x.pos, "%s:expire_in should be a duration or never, found %q", at, s)
				}
			}
			a.ExpireIn = s
		}
	}
	if x := n.get("name"); x != nil {
		a.Name, _ = c.str(x, at+":name")
	}
	if x := n.get("expose_as"); x != nil {
		a.ExposeAs, _ = c.str(x, at+":expose_as")
	}
	if x := n.get("public"); x != nil {
		b, _ := c.boolean(x, at+":public")
		a.Public = &b
	}
	if x := n.get("access"); x != nil {
		a.Access, _ = c.oneOf(x, at+":access", "all", "developer", "maintainer", "none")
	}
	if x := n.get("reports"); x != nil && c.mapping(x, at+":reports") {
		for _, e := range x.m {
			rat := at + ":reports:" + e.key
			if e.key == "coverage_report" {
				if !c.mapping(e.val, rat) {
					continue
				}
				c.checkKeys(e.val, rat, "coverage_format", "path")
				r := Report{Type: e.key}
				if y := e.val.get("coverage_format"); y != nil {
					r.CoverageFormat, _ = c.oneOf(y, rat+":coverage_format", "cobertura", "jacoco")
				} else {
					c.d.errorf(e.val.pos, "%s: coverage_format is required", rat)
				}
				if y := e.val.get("path"); y != nil {
					p, _ := c.str(y, rat+":path")
					r.Paths = []string{p}
				} else {
					c.d.errorf(e.val.pos, "%s: path is required", rat)
				}
				a.Reports = append(a.Reports, r)
				continue
			}
			if _, ok := reportFormats[e.key]; !ok {
				c.d.errorf(e.keyPos, "%s: unknown report type %q", at+":reports", e.key)
				continue
			}
			if e.key == "cobertura" {
				c.d.warnf(e.keyPos, "%s: GitLab removed this report type in 16.0 and refuses it; use coverage_report: {coverage_format: cobertura, path: …}", rat)
			}
			paths, _ := c.strList(e.val, rat, true, true)
			a.Reports = append(a.Reports, Report{Type: e.key, Paths: paths})
		}
	}
	return a
}

func (c *compiler) caches(n *node, at string) []Cache {
	if n.kind == kMap {
		if cc := c.cache(n, at); cc != nil {
			return []Cache{*cc}
		}
		return nil
	}
	if n.kind != kSeq {
		c.d.errorf(n.pos, "%s should be a mapping or a list of mappings, found %s", at, n.describe())
		return nil
	}
	// A list nested in the list (an anchor of caches used as one item)
	// is flattened, as GitLab does.
	var items []*node
	var walk func(n *node, depth int)
	walk = func(n *node, depth int) {
		for _, x := range n.seq {
			if x.kind == kSeq && depth < 10 {
				walk(x, depth+1)
				continue
			}
			items = append(items, x)
		}
	}
	walk(n, 0)
	if len(items) > 4 {
		c.d.errorf(n.pos, "%s: no more than 4 caches can be defined, found %d", at, len(items))
	}
	out := []Cache{}
	for i, x := range items {
		if cc := c.cache(x, at+":"+strconv.Itoa(i)); cc != nil {
			out = append(out, *cc)
		}
	}
	return out
}

func (c *compiler) cache(n *node, at string) *Cache {
	if !c.mapping(n, at) {
		return nil
	}
	n = n.withoutNulls()
	c.checkKeys(n, at, "key", "paths", "untracked", "policy", "when", "fallback_keys", "unprotect")
	cc := &Cache{Key: "default", Policy: "pull-push", When: OnSuccess}
	if x := n.get("key"); x != nil {
		switch x.kind {
		case kScalar:
			if s, ok := c.str(x, at+":key"); ok {
				cc.Key = s
				c.checkCacheKey(x, at+":key", s)
			}
		case kMap:
			c.checkKeys(x, at+":key", "files", "files_commits", "prefix")
			field, f := "files", x.get("files")
			switch fc := x.get("files_commits"); {
			case f != nil && fc != nil:
				c.d.errorf(fc.pos, "%s:key: files and files_commits cannot be used together", at)
			case fc != nil:
				field, f = "files_commits", fc
				cc.KeyByCommits = true
			}
			files, ok := c.strList(f, at+":key:"+field, false, false)
			if f == nil || (ok && len(files) == 0) {
				c.d.errorf(x.pos, "%s:key: files or files_commits is required with a key mapping", at)
			}
			if len(files) > 2 {
				c.d.errorf(f.pos, "%s:key:%s: at most 2 files or patterns, found %d", at, field, len(files))
			}
			cc.KeyFiles = files
			if y := x.get("prefix"); y != nil {
				cc.KeyPrefix, _ = c.str(y, at+":key:prefix")
				c.checkCacheKey(y, at+":key:prefix", cc.KeyPrefix)
			}
			cc.Key = ""
		default:
			c.d.errorf(x.pos, "%s:key should be a string or a mapping with files or files_commits, found %s", at, x.describe())
		}
	}
	if x := n.get("paths"); x != nil {
		cc.Paths, _ = c.strList(x, at+":paths", false, true)
	}
	if x := n.get("untracked"); x != nil {
		cc.Untracked, _ = c.boolean(x, at+":untracked")
	}
	if x := n.get("unprotect"); x != nil {
		cc.Unprotect, _ = c.boolean(x, at+":unprotect")
	}
	if x := n.get("policy"); x != nil {
		// A policy with a variable (GitLab 16.1) is checked by the runner
		// once the job's variables are known.
		if s, ok := c.str(x, at+":policy"); ok && strings.Contains(s, "$") {
			cc.Policy = s
		} else if ok {
			cc.Policy, _ = c.oneOf(x, at+":policy", "pull-push", "pull", "push")
		}
	}
	if x := n.get("when"); x != nil {
		w, _ := c.oneOf(x, at+":when", "on_success", "on_failure", "always")
		cc.When = When(w)
	}
	if x := n.get("fallback_keys"); x != nil {
		cc.FallbackKeys, _ = c.strList(x, at+":fallback_keys", false, false)
		if len(cc.FallbackKeys) > 5 {
			c.d.errorf(x.pos, "%s:fallback_keys: at most 5 keys, found %d", at, len(cc.FallbackKeys))
		}
	}
	return cc
}

func (c *compiler) checkCacheKey(n *node, at, s string) {
	l := strings.ToLower(s)
	switch {
	case strings.Contains(s, "/") || strings.Contains(l, "%2f"):
		c.d.errorf(n.pos, "%s cannot contain the \"/\" character", at)
	case s == "." || s == ".." || l == "%2e" || l == "%2e%2e":
		c.d.errorf(n.pos, "%s cannot be \".\" or \"..\"", at)
	}
}

// retryReasons are the failure reasons retry:when accepts: GitLab's
// current list (19.1 split runner_system_failure, script_failure,
// stuck_or_timeout_failure and job_execution_timeout into finer reasons;
// the old names stay valid).
var retryReasons = []string{"always", "unknown_failure", "script_failure", "api_failure",
	"stuck_or_timeout_failure", "runner_system_failure", "runner_configuration_error",
	"runner_external_dependency_failure", "runner_interrupted", "runner_unsupported", "stale_schedule",
	"job_execution_timeout", "archived_failure", "unmet_prerequisites", "scheduler_failure",
	"data_integrity_failure", "missing_dependency_failure",
	"stuck_pending_with_matching_runners", "stuck_pending_no_matching_runners", "no_updates_running",
	"no_updates_canceling", "server_timeout_running", "server_timeout_canceling"}

func (c *compiler) retry(n *node, at string) Retry {
	var r Retry
	checkMax := func(x *node, at string) {
		v, ok := c.integer(x, at)
		if ok && (v < 0 || v > 2) {
			c.d.errorf(x.pos, "%s should be 0, 1 or 2, found %d", at, v)
			return
		}
		r.Max = v
	}
	if n.kind == kScalar {
		checkMax(n, at)
		return r
	}
	if !c.mapping(n, at) {
		return r
	}
	c.checkKeys(n, at, "max", "when", "exit_codes")
	if x := n.get("max"); x != nil {
		checkMax(x, at+":max")
	}
	if x := n.get("when"); x != nil {
		ws, ok := c.strList(x, at+":when", true, false)
		if ok {
			for _, w := range ws {
				if indexOf(retryReasons, w) < 0 {
					c.d.errorf(x.pos, "%s:when: unknown failure reason %q (allowed: %s)", at, w, strings.Join(retryReasons, ", "))
				}
			}
			if indexOf(ws, "always") < 0 {
				r.When = ws
			}
		}
	}
	if x := n.get("exit_codes"); x != nil {
		r.ExitCodes = c.exitCodes(x, at+":exit_codes")
	}
	return r
}

func (c *compiler) exitCodes(n *node, at string) []int {
	if n.kind == kScalar {
		v, ok := c.integer(n, at)
		if ok {
			return []int{v}
		}
		return nil
	}
	if n.kind != kSeq || len(n.seq) == 0 {
		c.d.errorf(n.pos, "%s should be an integer or a list of integers, found %s", at, n.describe())
		return nil
	}
	var out []int
	for _, x := range n.seq {
		if v, ok := c.integer(x, at); ok {
			out = append(out, v)
		}
	}
	return out
}

// duration parses a duration with an upper limit.
func (c *compiler) duration(n *node, at string, limit time.Duration) (time.Duration, bool) {
	s, ok := "", false
	if n != nil && n.kind == kScalar && (n.tag == "!!int" || n.tag == "!!str" || n.tag == "!!float") {
		s, ok = n.str, true
	}
	if !ok {
		c.d.errorf(posOf(n), "%s should be a duration, found %s", at, n.describe())
		return 0, false
	}
	d, err := ParseDuration(s)
	if err != nil {
		c.d.errorf(n.pos, "%s should be a duration like \"1h 30m\", found %q", at, s)
		return 0, false
	}
	if limit > 0 && d > limit {
		c.d.errorf(n.pos, "%s should not exceed %s", at, formatDuration(limit))
		return d, false
	}
	return d, true
}

// environmentNameRe is GitLab's Gitlab::Regex.environment_name_regex: what
// an environment's name may hold as written (variables unexpanded).
var environmentNameRe = regexp.MustCompile(`^[a-zA-Z0-9_${}. -]([a-zA-Z0-9_/${}. -]*[a-zA-Z0-9_${}. -])?$`)

// checkEnvironmentName reports a name GitLab refuses, in its words.
func (c *compiler) checkEnvironmentName(name string, pos Pos, at string) {
	if name != "" && !environmentNameRe.MatchString(name) {
		c.d.errorf(pos, "%s name can contain only letters, digits, '-', '_', '/', '$', '{', '}', '.', and spaces, but it cannot start or end with '/' (found %q)", at, name)
	}
}

func (c *compiler) environment(n *node, at string) *Environment {
	if n.kind == kScalar {
		s, ok := c.str(n, at)
		if !ok {
			return nil
		}
		if s == "" {
			c.d.errorf(n.pos, "%s: name is required", at)
		}
		c.checkEnvironmentName(s, n.pos, at)
		return &Environment{Name: s, Action: "start"}
	}
	if !c.mapping(n, at) {
		return nil
	}
	c.checkKeys(n, at, "name", "url", "on_stop", "action", "auto_stop_in", "kubernetes", "deployment_tier")
	e := &Environment{Action: "start"}
	if x := n.get("name"); x != nil {
		e.Name, _ = c.str(x, at+":name")
		c.checkEnvironmentName(e.Name, x.pos, at)
	}
	if e.Name == "" {
		c.d.errorf(n.pos, "%s: name is required", at)
	}
	if x := n.get("url"); x != nil {
		e.URL, _ = c.str(x, at+":url")
	}
	if x := n.get("on_stop"); x != nil {
		e.OnStop, _ = c.str(x, at+":on_stop")
	}
	if x := n.get("action"); x != nil {
		e.Action, _ = c.oneOf(x, at+":action", "start", "prepare", "stop", "verify", "access")
	}
	if x := n.get("auto_stop_in"); x != nil {
		if s, ok := c.str(x, at+":auto_stop_in"); ok {
			// A value with variables is expanded when the job deploys
			// (GitLab since 15.4): checked then, not here.
			if _, err := ParseDuration(s); err != nil && s != "never" && !strings.Contains(s, "$") {
				c.d.errorf(x.pos, "%s:auto_stop_in should be a duration or never, found %q", at, s)
			}
			e.AutoStopIn = s
		}
	}
	if x := n.get("deployment_tier"); x != nil {
		e.DeploymentTier, _ = c.oneOf(x, at+":deployment_tier", "production", "staging", "testing", "development", "other")
	}
	if x := n.get("kubernetes"); x != nil && c.mapping(x, at+":kubernetes") {
		// GitLab 18.4: dashboard:{namespace, flux_resource_path} and
		// managed_resources:{enabled}; the top-level namespace and
		// flux_resource_path are the deprecated forms.
		kat := at + ":kubernetes"
		c.checkKeys(x, kat, "agent", "namespace", "flux_resource_path", "dashboard", "managed_resources")
		for _, k := range []string{"agent", "flux_resource_path"} {
			if y := x.get(k); !y.isNull() {
				c.str(y, kat+":"+k)
			}
		}
		if y := x.get("namespace"); y != nil {
			e.KubernetesNS, _ = c.str(y, kat+":namespace")
		}
		if d := x.get("dashboard"); !d.isNull() && c.mapping(d, kat+":dashboard") {
			c.checkKeys(d, kat+":dashboard", "namespace", "flux_resource_path")
			if y := d.get("flux_resource_path"); !y.isNull() {
				c.str(y, kat+":dashboard:flux_resource_path")
			}
			if y := d.get("namespace"); !y.isNull() {
				if ns, ok := c.str(y, kat+":dashboard:namespace"); ok && e.KubernetesNS == "" {
					e.KubernetesNS = ns
				}
			}
		}
		if m := x.get("managed_resources"); !m.isNull() && c.mapping(m, kat+":managed_resources") {
			c.checkKeys(m, kat+":managed_resources", "enabled")
			if y := m.get("enabled"); !y.isNull() {
				c.boolean(y, kat+":managed_resources:enabled")
			}
		}
	}
	return e
}

// coverage checks a coverage regexp (/.../).
func (c *compiler) coverage(n *node, at string) string {
	s, ok := c.str(n, at)
	if !ok {
		return ""
	}
	if !strings.HasPrefix(s, "/") {
		c.d.errorf(n.pos, "%s should be a regular expression between slashes, like /Coverage: \\d+%%/", at)
		return ""
	}
	if _, err := compilePattern(s); err != nil {
		c.d.errorf(n.pos, "%s: %v", at, err)
		return ""
	}
	return s
}

var _ = regexp.Compile
var _ = context.Background
