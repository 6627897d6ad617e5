package ci

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func jobOf(t *testing.T, p *Pipeline, name string) *Job {
	t.Helper()
	j := p.Job(name)
	if j == nil {
		t.Fatalf("no job %q in %v", name, jobNames(p.Jobs))
	}
	return j
}

func eq(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s = %#v, want %#v", what, got, want)
	}
}

func varMap(vs []Variable) map[string]string {
	m := map[string]string{}
	for _, v := range vs {
		m[v.Key] = v.Value
	}
	return m
}

func varKeys(vs []Variable) []string {
	out := []string{}
	for _, v := range vs {
		out = append(out, v.Key)
	}
	return out
}

func TestKeywords(t *testing.T) {
	tests := []struct {
		name  string
		yml   string
		check func(t *testing.T, p *Pipeline)
	}{
		{"stages and order", `
stages: [build, test]
t2:
  script: x
b:
  stage: build
  script: x
pre:
  stage: .pre
  script: x
t1:
  script: x
post:
  stage: .post
  script: x
`, func(t *testing.T, p *Pipeline) {
			eq(t, "stages", p.Stages, []string{".pre", "build", "test", ".post"})
			eq(t, "jobs", jobNames(p.Jobs), []string{"pre", "b", "t2", "t1", "post"})
			eq(t, "stage index", jobOf(t, p, "t1").StageIndex, 2)
		}},
		{"default stages", "j:\n  script: x\n", func(t *testing.T, p *Pipeline) {
			eq(t, "stages", p.Stages, []string{".pre", "build", "test", "deploy", ".post"})
			eq(t, "stage", jobOf(t, p, "j").Stage, "test")
		}},
		{"scripts flatten nested lists", `
j:
  before_script: setup
  script:
    - a
    - [b, [c, d]]
  after_script: [cleanup]
`, func(t *testing.T, p *Pipeline) {
			j := jobOf(t, p, "j")
			eq(t, "before", j.BeforeScript, []string{"setup"})
			eq(t, "script", j.Script, []string{"a", "b", "c", "d"})
			eq(t, "after", j.AfterScript, []string{"cleanup"})
		}},
		{"defaults are inherited unless set or refused", `
default:
  image: golang:1.24
  before_script: [setup]
  after_script: [cleanup]
  tags: [docker]
  timeout: 1h 30m
  retry: 2
  interruptible: true
  services: [postgres]
  cache: {paths: [.cache]}
  artifacts: {paths: [out]}
a:
  script: x
b:
  image: alpine
  tags: []
  script: x
c:
  inherit:
    default: false
  script: x
d:
  inherit:
    default: [image, tags]
  script: x
`, func(t *testing.T, p *Pipeline) {
			a := jobOf(t, p, "a")
			eq(t, "a.image", a.Image, &Image{Name: "golang:1.24"})
			eq(t, "a.before", a.BeforeScript, []string{"setup"})
			eq(t, "a.after", a.AfterScript, []string{"cleanup"})
			eq(t, "a.tags", a.Tags, []string{"docker"})
			eq(t, "a.timeout", a.Timeout, 90*time.Minute)
			eq(t, "a.retry", a.Retry, Retry{Max: 2})
			eq(t, "a.interruptible", a.Interruptible, true)
			eq(t, "a.services", a.Services, []Image{{Name: "postgres"}})
			eq(t, "a.cache", a.Cache, []Cache{{Key: "default", Paths: []string{".cache"}, Policy: "pull-push", When: OnSuccess}})
			eq(t, "a.artifacts", a.Artifacts, &Artifacts{Paths: []string{"out"}, When: OnSuccess})
			b := jobOf(t, p, "b")
			eq(t, "b.image", b.Image, &Image{Name: "alpine"})
			eq(t, "b.tags", b.Tags, []string{})
			c := jobOf(t, p, "c")
			if c.Image != nil || c.BeforeScript != nil || c.Tags != nil || c.Timeout != 0 || c.Interruptible {
				t.Errorf("c inherited defaults: %+v", c)
			}
			d := jobOf(t, p, "d")
			eq(t, "d.image", d.Image, &Image{Name: "golang:1.24"})
			eq(t, "d.tags", d.Tags, []string{"docker"})
			eq(t, "d.before", d.BeforeScript, []string(nil))
		}},
		{"top-level globals act as defaults", `
image: ruby:3
before_script: [bundle]
j:
  script: x
`, func(t *testing.T, p *Pipeline) {
			j := jobOf(t, p, "j")
			eq(t, "image", j.Image, &Image{Name: "ruby:3"})
			eq(t, "before", j.BeforeScript, []string{"bundle"})
		}},
		{"null resets nothing: a null key is unset", `
default:
  image: golang
j:
  image: null
  script: x
`, func(t *testing.T, p *Pipeline) {
			eq(t, "image", jobOf(t, p, "j").Image, &Image{Name: "golang"})
		}},
		{"variables: global, job, forms, inherit", `
variables:
  A: global-a
  B: "2"
  N: 10
  DESC:
    value: v
    description: shown in the run form
    options: [v, w]
j:
  variables:
    A: job-a
    RAW:
      value: $NOT_EXPANDED
      expand: false
  script: x
k:
  inherit:
    variables: false
  script: x
l:
  inherit:
    variables: [B]
  script: x
`, func(t *testing.T, p *Pipeline) {
			j := jobOf(t, p, "j")
			eq(t, "keys", varKeys(j.Variables), []string{"A", "B", "N", "DESC", "RAW"})
			eq(t, "values", varMap(j.Variables), map[string]string{"A": "job-a", "B": "2", "N": "10", "DESC": "v", "RAW": "$NOT_EXPANDED"})
			if !j.Variables[4].Raw || j.Variables[0].Raw {
				t.Errorf("raw flags wrong: %+v", j.Variables)
			}
			eq(t, "k", varKeys(jobOf(t, p, "k").Variables), []string{})
			eq(t, "l", varKeys(jobOf(t, p, "l").Variables), []string{"B"})
			eq(t, "pipeline description", p.Variables[3].Description, "shown in the run form")
			eq(t, "pipeline options", p.Variables[3].Options, []string{"v", "w"})
		}},
		{"image object", `
j:
  image:
    name: registry.test/img:1
    entrypoint: [""]
    pull_policy: [always, if-not-present]
    docker:
      platform: linux/arm64
      user: "1000"
  script: x
`, func(t *testing.T, p *Pipeline) {
			eq(t, "image", jobOf(t, p, "j").Image, &Image{Name: "registry.test/img:1", Entrypoint: []string{""},
				PullPolicy: []string{"always", "if-not-present"}, DockerPlatform: "linux/arm64", DockerUser: "1000"})
		}},
		{"services strings and objects", `
j:
  services:
    - redis:7
    - name: postgres:16
      alias: db,pg
      entrypoint: [docker-entrypoint.sh]
      command: [postgres, -c, fsync=off]
      variables:
        POSTGRES_PASSWORD: secret
      pull_policy: if-not-present
  script: x
`, func(t *testing.T, p *Pipeline) {
			s := jobOf(t, p, "j").Services
			if len(s) != 2 {
				t.Fatalf("services = %+v", s)
			}
			eq(t, "s0", s[0], Image{Name: "redis:7"})
			eq(t, "s1.alias", s[1].Alias, "db,pg")
			eq(t, "s1.command", s[1].Command, []string{"postgres", "-c", "fsync=off"})
			eq(t, "s1.entrypoint", s[1].Entrypoint, []string{"docker-entrypoint.sh"})
			eq(t, "s1.vars", varMap(s[1].Variables), map[string]string{"POSTGRES_PASSWORD": "secret"})
			eq(t, "s1.pull", s[1].PullPolicy, []string{"if-not-present"})
		}},
		{"artifacts", `
j:
  artifacts:
    name: "$CI_JOB_NAME"
    paths: [bin/, dist/]
    exclude: [bin/*.o]
    untracked: true
    when: always
    expire_in: 2 days
    expose_as: Build output
    reports:
      junit: [report.xml]
      dotenv: build.env
      coverage_report:
        coverage_format: cobertura
        path: coverage.xml
  script: x
`, func(t *testing.T, p *Pipeline) {
			eq(t, "artifacts", jobOf(t, p, "j").Artifacts, &Artifacts{
				Name: "$CI_JOB_NAME", Paths: []string{"bin/", "dist/"}, Exclude: []string{"bin/*.o"}, Untracked: true,
				When: Always, ExpireIn: "2 days", ExposeAs: "Build output",
				Reports: []Report{
					{Type: "junit", Paths: []string{"report.xml"}},
					{Type: "dotenv", Paths: []string{"build.env"}},
					{Type: "coverage_report", Paths: []string{"coverage.xml"}, CoverageFormat: "cobertura"},
				},
			})
		}},
		{"cache forms", `
j:
  cache:
    - key: deps-$CI_COMMIT_REF_SLUG
      paths: [vendor/]
      policy: pull
      when: always
      untracked: true
      fallback_keys: [deps-main]
    - key:
        files: [go.sum, go.mod]
        prefix: go
      paths: [.go/]
    - paths: [tmp/]
  script: x
`, func(t *testing.T, p *Pipeline) {
			eq(t, "cache", jobOf(t, p, "j").Cache, []Cache{
				{Key: "deps-$CI_COMMIT_REF_SLUG", Paths: []string{"vendor/"}, Policy: "pull", When: Always, Untracked: true, FallbackKeys: []string{"deps-main"}},
				{Key: "", KeyFiles: []string{"go.sum", "go.mod"}, KeyPrefix: "go", Paths: []string{".go/"}, Policy: "pull-push", When: OnSuccess},
				{Key: "default", Paths: []string{"tmp/"}, Policy: "pull-push", When: OnSuccess},
			})
		}},
		{"allow_failure and when", `
a:
  script: x
  allow_failure: true
b:
  script: x
  allow_failure:
    exit_codes: 137
c:
  script: x
  allow_failure:
    exit_codes: [1, 2]
m:
  script: x
  when: manual
n:
  script: x
  when: manual
  allow_failure: false
d:
  script: x
  when: delayed
  start_in: 30 minutes
o:
  script: x
  when: on_failure
`, func(t *testing.T, p *Pipeline) {
			eq(t, "a", jobOf(t, p, "a").AllowFailure, true)
			b := jobOf(t, p, "b")
			eq(t, "b", [2]any{b.AllowFailure, b.AllowFailureExitCodes}, [2]any{false, []int{137}})
			eq(t, "c", jobOf(t, p, "c").AllowFailureExitCodes, []int{1, 2})
			eq(t, "m (manual jobs may fail by default)", jobOf(t, p, "m").AllowFailure, true)
			eq(t, "n", jobOf(t, p, "n").AllowFailure, false)
			d := jobOf(t, p, "d")
			eq(t, "d", [2]any{d.When, d.StartIn}, [2]any{Delayed, 30 * time.Minute})
			eq(t, "o", jobOf(t, p, "o").When, OnFailure)
		}},
		{"retry forms", `
a:
  script: x
  retry: 1
b:
  script: x
  retry:
    max: 2
    when: [runner_system_failure, stuck_or_timeout_failure]
    exit_codes: [137]
c:
  script: x
  retry:
    max: 2
    when: always
`, func(t *testing.T, p *Pipeline) {
			eq(t, "a", jobOf(t, p, "a").Retry, Retry{Max: 1})
			eq(t, "b", jobOf(t, p, "b").Retry, Retry{Max: 2, When: []string{"runner_system_failure", "stuck_or_timeout_failure"}, ExitCodes: []int{137}})
			eq(t, "c", jobOf(t, p, "c").Retry, Retry{Max: 2})
		}},
		{"recorded keywords", `
deploy:
  stage: deploy
  script: x
  interruptible: yes
  resource_group: production
  coverage: '/total: \d+\.\d+%/'
  environment:
    name: review/$CI_COMMIT_REF_SLUG
    url: https://$CI_COMMIT_REF_SLUG.example.test
    on_stop: stop
    auto_stop_in: 1 week
    deployment_tier: staging
  hooks:
    pre_get_sources_script: [git config --global x y]
stop:
  stage: deploy
  script: x
  when: manual
  environment:
    name: review/$CI_COMMIT_REF_SLUG
    action: stop
simple:
  script: x
  environment: production
`, func(t *testing.T, p *Pipeline) {
			d := jobOf(t, p, "deploy")
			eq(t, "interruptible", d.Interruptible, true)
			eq(t, "resource_group", d.ResourceGroup, "production")
			eq(t, "coverage", d.Coverage, `/total: \d+\.\d+%/`)
			eq(t, "environment", d.Environment, &Environment{Name: "review/$CI_COMMIT_REF_SLUG", URL: "https://$CI_COMMIT_REF_SLUG.example.test",
				OnStop: "stop", Action: "start", AutoStopIn: "1 week", DeploymentTier: "staging"})
			eq(t, "hooks", d.PreGetSourcesScript, []string{"git config --global x y"})
			eq(t, "stop action", jobOf(t, p, "stop").Environment.Action, "stop")
			eq(t, "simple", jobOf(t, p, "simple").Environment, &Environment{Name: "production", Action: "start"})
		}},
		{"hidden jobs are templates only", `
.tmpl:
  script: x
j:
  script: y
`, func(t *testing.T, p *Pipeline) {
			eq(t, "jobs", jobNames(p.Jobs), []string{"j"})
		}},
		{"type is a deprecated alias of stage", `
j:
  type: build
  script: x
`, func(t *testing.T, p *Pipeline) {
			eq(t, "stage", jobOf(t, p, "j").Stage, "build")
			if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0].String(), "type is deprecated") {
				t.Errorf("warnings = %v", p.Warnings)
			}
		}},
		{"duplicate keys warn and the last wins", "j:\n  script: a\n  script: b\n", func(t *testing.T, p *Pipeline) {
			eq(t, "script", jobOf(t, p, "j").Script, []string{"b"})
			eq(t, "warnings", len(p.Warnings), 1)
			eq(t, "warning", p.Warnings[0].String(), `.gitlab-ci.yml:3:3: duplicate key "script" (first at .gitlab-ci.yml:2:3); the last one wins, as in GitLab`)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.check(t, mustCompile(t, tt.yml, Env{}))
		})
	}
}

func TestCacheKeyFiles(t *testing.T) {
	yml := `
a:
  script: x
  cache:
    key: {files: [go.sum], prefix: go}
b:
  script: x
  cache:
    key: {files: [missing.lock]}
c:
  script: x
  cache:
    - key: {files_commits: [go.sum], prefix: $CI_JOB_NAME}
    - key: {files: [go.sum]}
`
	type ask struct {
		files   []string
		commits bool
	}
	var asked []ask
	env := Env{CacheKey: func(ctx context.Context, files []string, commits bool) (string, error) {
		asked = append(asked, ask{files, commits})
		switch {
		case files[0] != "go.sum":
			return "", nil
		case commits:
			return "bycommit", nil
		}
		return "abc123", nil
	}}
	p := mustCompile(t, yml, env)
	eq(t, "a key", jobOf(t, p, "a").Cache[0].Key, "go-abc123")
	eq(t, "b key", jobOf(t, p, "b").Cache[0].Key, "default")
	eq(t, "c keys", []string{jobOf(t, p, "c").Cache[0].Key, jobOf(t, p, "c").Cache[1].Key}, []string{"$CI_JOB_NAME-bycommit", "abc123"}) // the runner expands the key
	// Each distinct list is computed once per pipeline, per kind.
	eq(t, "asked", asked, []ask{{[]string{"go.sum"}, false}, {[]string{"missing.lock"}, false}, {[]string{"go.sum"}, true}})

	for yml, want := range map[string]string{
		"j:\n  script: x\n  cache:\n    key: {files: [a], files_commits: [b]}\n": "files and files_commits cannot be used together",
		"j:\n  script: x\n  cache:\n    key: {prefix: p}\n":                      "files or files_commits is required",
		"j:\n  script: x\n  cache:\n    key: {files_commits: []}\n":              "files or files_commits is required",
		"j:\n  script: x\n  cache:\n    key: {files_commits: [a, b, c]}\n":       "cache:key:files_commits: at most 2 files or patterns, found 3",
		"j:\n  script: x\n  cache:\n    key: {files_commits: a}\n":               "cache:key:files_commits",
		"j:\n  script: x\n  cache:\n    key: {files: [a], files_commit: [b]}\n":  "files_commit",
		"j:\n  script: x\n  cache:\n    key: [a]\n":                              "a mapping with files or files_commits",
	} {
		_, err := compileYAML(t, yml, env)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one naming %q", yml, err, want)
		}
	}
}

// GitLab stores every variable as a string: booleans (YAML 1.1's too, as
// Ruby's parser reads them) become "true"/"false", null the empty string.
func TestVariableValuesAsGitLabStoresThem(t *testing.T) {
	p := mustCompile(t, `variables:
  ON: yes
  OFF: off
  NONE:
.base:
  variables:
    EXTRA:
test:
  extends: .base
  script: t
  variables:
    FLAG: true
    NUM: 010
    QUOTED: '010'
    SIZE: 40_000_000
    PY: 3.10
    RAW: {value: false, expand: false}
  rules:
    - if: $FLAG == "true" && $ON == "true"
      variables: {FROM_RULE: false}
`, branch("main"))
	j := jobOf(t, p, "test")
	// Unquoted numbers as Ruby reads and prints them (octal 010 is 8),
	// each with a warning.
	want := map[string]string{"ON": "true", "OFF": "false", "NONE": "", "EXTRA": "", "FLAG": "true", "NUM": "8", "QUOTED": "010",
		"SIZE": "40000000", "PY": "3.1", "RAW": "false", "FROM_RULE": "false"}
	got := map[string]string{}
	for _, v := range append(append([]Variable(nil), p.Variables...), j.Variables...) {
		got[v.Key] = v.Value
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s = %q (set %v), want %q", k, g, ok, w)
		}
	}
	if j.When != OnSuccess {
		t.Errorf("rules:if on boolean variables did not match: when %s", j.When)
	}
	var warned []string
	for _, w := range p.Warnings {
		warned = append(warned, w.String())
	}
	if len(warned) != 3 || !strings.Contains(warned[0], ".gitlab-ci.yml:13:10: jobs:test:variables:NUM: GitLab reads the unquoted 010 as 8; quote it") ||
		!strings.Contains(warned[2], "PY: GitLab reads the unquoted 3.10 as 3.1") {
		t.Errorf("warnings:\n%s", strings.Join(warned, "\n"))
	}
	errs := compileErrors(t, "test:\n  script: t\n  variables:\n    A: [x]\n", branch("main"))
	if len(errs) != 1 || !strings.Contains(errs[0], "jobs:test:variables:A should be a string, a number or a mapping with value") {
		t.Errorf("list value: %q", errs)
	}
}

// cache:policy may be a variable (GitLab 16.1): the runner expands and
// checks it; a literal is checked here.
func TestCachePolicyVariable(t *testing.T) {
	p := mustCompile(t, "variables: {POLICY: pull}\ntest:\n  script: t\n  cache: {key: k, paths: [v/], policy: $POLICY}\n", branch("main"))
	if got := jobOf(t, p, "test").Cache[0].Policy; got != "$POLICY" {
		t.Errorf("policy = %q, want $POLICY kept for the runner", got)
	}
	errs := compileErrors(t, "test:\n  script: t\n  cache: {key: k, paths: [v/], policy: sometimes}\n", branch("main"))
	if len(errs) != 1 || !strings.Contains(errs[0], `policy should be one of pull-push, pull, push, found "sometimes"`) {
		t.Errorf("literal policy: %q", errs)
	}
}

// Null values GitLab ignores: an only/except set to null beside rules
// (overriding a template's), a null entry in needs.
func TestNullsGitLabIgnores(t *testing.T) {
	p := mustCompile(t, `.common: &common
  except: [tags]
build:
  script: b
test:
  <<: *common
  except: null
  script: t
  rules: [{when: manual}]
  needs:
    -
    - build
none:
  script: n
  needs: [null]
commented:
  extends:
    # - .common
  script: c
  start_in:
  rules: [{when: on_success}]
plain:
  script: p
  start_in: null
`, branch("main"))
	for _, name := range []string{"commented", "plain"} {
		if j := jobOf(t, p, name); j.When != OnSuccess || j.StartIn != 0 {
			t.Errorf("%s: when %s start_in %s, want a null extends and start_in ignored", name, j.When, j.StartIn)
		}
	}
	if j := jobOf(t, p, "test"); j.When != Manual || len(j.Needs) != 1 || j.Needs[0].Job != "build" {
		t.Errorf("test: when %s needs %+v", j.When, j.Needs)
	}
	if j := jobOf(t, p, "none"); j.Scheduling != ScheduleDAG || len(j.Needs) != 0 {
		t.Errorf("needs: [null] should be needs: [] (DAG, no needs): %+v %s", j.Needs, j.Scheduling)
	}
}

// needs:pipeline and needs:project: artifacts from outside the pipeline,
// without ordering it.
func TestCrossNeeds(t *testing.T) {
	p := mustCompile(t, `build:
  script: b
use:
  needs:
    - build
    - pipeline: $PARENT_PIPELINE_ID
      job: generate
    - project: group/lib
      job: compile
      ref: v1.2
      artifacts: false
  script: u
only-cross:
  stage: build
  needs: [{pipeline: "42", job: gen}]
  script: o
`, branch("main"))
	use := jobOf(t, p, "use")
	if len(use.Needs) != 1 || use.Needs[0].Job != "build" {
		t.Errorf("use needs %+v, want build only", use.Needs)
	}
	want := []CrossNeed{{Pipeline: "$PARENT_PIPELINE_ID", Job: "generate", Artifacts: true}, {Project: "group/lib", Job: "compile", Ref: "v1.2"}}
	if len(use.CrossNeeds) != 2 {
		t.Fatalf("cross needs %+v", use.CrossNeeds)
	}
	for i, w := range want {
		g := use.CrossNeeds[i]
		g.Pos = Pos{}
		if g != w {
			t.Errorf("cross need %d = %+v, want %+v", i, g, w)
		}
	}
	if o := jobOf(t, p, "only-cross"); o.Scheduling != ScheduleDAG || len(o.Needs) != 0 || len(o.CrossNeeds) != 1 {
		t.Errorf("only-cross: %s needs %+v cross %+v, want DAG without pipeline needs", o.Scheduling, o.Needs, o.CrossNeeds)
	}
	for _, tt := range []struct{ yml, want string }{
		{"a:\n  script: x\n  needs: [{pipeline: $P}]\n", "jobs:a:needs: job is required (a need on a pipeline without job mirrors an upstream project's pipeline status"},
		{"a:\n  script: x\n  needs: [{project: g/p, job: b}]\n", "jobs:a:needs: a need on another project requires ref"},
		{"a:\n  script: x\n  needs: [{pipeline: $P, job: b, ref: main}]\n", `jobs:a:needs: unknown keyword "ref"`},
		{"a:\n  script: x\n  needs: [{project: g/p, job: b, ref: main, optional: true}]\n", `jobs:a:needs: unknown keyword "optional"`},
	} {
		errs := compileErrors(t, tt.yml, branch("main"))
		if len(errs) == 0 || !strings.Contains(strings.Join(errs, "\n"), tt.want) {
			t.Errorf("%q: errors %q, want %q", tt.yml, errs, tt.want)
		}
	}
}

// An empty key in cache or artifacts is no key (GitLab's allow_nil).
func TestEmptyCacheAndArtifactKeys(t *testing.T) {
	p := mustCompile(t, "a:\n  script: x\n  cache:\n    key: k\n    paths:\n  artifacts:\n    paths: [out/]\n    exclude:\n", branch("main"))
	j := jobOf(t, p, "a")
	if len(j.Cache) != 1 || len(j.Cache[0].Paths) != 0 || j.Artifacts == nil || len(j.Artifacts.Paths) != 1 {
		t.Errorf("cache %+v artifacts %+v", j.Cache, j.Artifacts)
	}
}

func TestMatrixExpressionWithoutMatrix(t *testing.T) {
	errs := compileErrors(t, "build:\n  script: b\n  parallel:\n    matrix:\n      - T: [a, b]\ntest:\n  script: t\n  needs:\n    - job: build\n      parallel:\n        matrix:\n          - T: ['$[[ matrix.T ]]']\n", branch("main"))
	if len(errs) != 1 || !strings.Contains(errs[0], "jobs:test:needs: $[[ matrix.T ]]: test has no parallel:matrix variable T") {
		t.Errorf("errors %q", errs)
	}
}

// More needs than GitLab's default ci_max_needs (50) warn; Limits.MaxNeeds
// is the error.
func TestNeedsLimit(t *testing.T) {
	var b strings.Builder
	for i := range 60 {
		fmt.Fprintf(&b, "j%d:\n  stage: build\n  script: x\n", i)
	}
	b.WriteString("last:\n  script: x\n  needs: [")
	for i := range 60 {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "j%d", i)
	}
	b.WriteString("]\n")
	p := mustCompile(t, b.String(), branch("main"))
	if len(jobOf(t, p, "last").Needs) != 60 || len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0].Msg, "60 needs: GitLab's default limit (ci_max_needs) is 50") {
		t.Errorf("warnings %v", p.Warnings)
	}
	env := branch("main")
	env.Limits.MaxNeeds = 40
	_, err := compileYAML(t, b.String(), env)
	if err == nil || !strings.Contains(err.Error(), "at most 40 needs, found 60") {
		t.Errorf("MaxNeeds 40: %v", err)
	}
	p = mustCompile(t, "a:\n  script: x\n  artifacts:\n    reports:\n      lsif: lsif.json\n", branch("main"))
	if r := jobOf(t, p, "a").Artifacts.Reports; len(r) != 1 || r[0].Type != "lsif" {
		t.Errorf("lsif report: %+v", r)
	}
}

// TestMergeKeyInOrder: a << after keys it also sets replaces them, as
// GitLab's YAML loader (Psych's Hash#merge!) does, with a warning; keys
// after it win over it.
func TestMergeKeyInOrder(t *testing.T) {
	p := mustCompile(t, `.tmpl: &tmpl
  stage: build
  script: [echo from-anchor]
  tags: [from-anchor]
job:
  stage: test
  script: [echo mine]
  <<: *tmpl
  tags: [mine]
`, branch("main"))
	j := jobOf(t, p, "job")
	if j.Stage != "build" || len(j.Script) != 1 || j.Script[0] != "echo from-anchor" || len(j.Tags) != 1 || j.Tags[0] != "mine" {
		t.Errorf("job: stage %s script %q tags %q; want build, the anchor's script, its own tags", j.Stage, j.Script, j.Tags)
	}
	warned := 0
	for _, w := range p.Warnings {
		if strings.Contains(w.Msg, "merge key << after key") {
			warned++
		}
	}
	if warned != 2 {
		t.Errorf("warnings %+v, want one for stage and one for script", p.Warnings)
	}
}

// TestJobLimits: MaxJobs bounds the jobs a pipeline creates, after rules
// (GitLab's ci_pipeline_size); a configuration may define five times as
// many (after parallel expansion).
func TestJobLimits(t *testing.T) {
	env := branch("main")
	env.Limits = Limits{MaxJobs: 3}
	yml := "many:\n  script: x\n  parallel: 6\n  rules: [{if: $NEVER}]\nfew:\n  script: x\n  parallel: 3\n"
	p := mustCompile(t, yml, env)
	eq(t, "created", len(p.Jobs), 3)
	errs := compileErrors(t, strings.Replace(yml, "parallel: 3", "parallel: 4", 1), env)
	eq(t, "errors", errs, []string{".gitlab-ci.yml:1:1: the pipeline would create 4 jobs, more than 3"})
	errs = compileErrors(t, strings.Replace(yml, "parallel: 6", "parallel: 13", 1), env)
	eq(t, "errors", errs, []string{".gitlab-ci.yml:5:1: the configuration defines more than 15 jobs (after parallel expansion, before rules)"})
}

// default: and workflow: are not reserved in GitLab: written like a job
// (script, run or trigger), they are jobs of that name, extends and all;
// otherwise they are the sections they name.
func TestDefaultAndWorkflowAsJobNames(t *testing.T) {
	p := mustCompile(t, `
.base: &base
  stage: build
  except: [tags]
default:
  <<: *base
  variables: {A: "1"}
  script: [make]
workflow:
  extends: .base
  trigger: {include: child.yml}
other:
  script: [x]
`, Env{})
	d := jobOf(t, p, "default")
	eq(t, "default's stage", d.Stage, "build")
	eq(t, "default's script", d.Script, []string{"make"})
	eq(t, "workflow's stage (from extends)", jobOf(t, p, "workflow").Stage, "build")
	if o := jobOf(t, p, "other"); len(o.Script) != 1 || o.Image != nil {
		t.Errorf("other: %+v (nothing inherited from a default: that is a job)", o)
	}

	// As sections they keep their own rules.
	p = mustCompile(t, `
default:
  image: alpine
workflow:
  rules: [{when: always}]
j:
  script: [x]
`, Env{})
	if img := jobOf(t, p, "j").Image; img == nil || img.Name != "alpine" {
		t.Errorf("j's image %+v, want alpine from default:", img)
	}
	if len(p.Jobs) != 1 {
		t.Errorf("jobs %d, want 1", len(p.Jobs))
	}
	errs := compileErrors(t, "default:\n  stage: test\nj:\n  script: [x]\n", Env{})
	if !strings.Contains(strings.Join(errs, "\n"), `default: unknown keyword "stage"`) {
		t.Errorf("a default: without script is the section: errors %v", errs)
	}
}

// environment:kubernetes takes GitLab 18.4's dashboard and
// managed_resources beside the deprecated namespace and flux_resource_path.
func TestEnvironmentKubernetes(t *testing.T) {
	p := mustCompile(t, `
deploy:
  script: [d]
  environment:
    name: production
    kubernetes:
      agent: path/to/agent/project:agent-name
      managed_resources: {enabled: false}
      dashboard: {namespace: my-namespace, flux_resource_path: helm.toolkit.fluxcd.io/v2/namespaces/gitlab-agent/helmreleases/gitlab-agent}
`, Env{})
	eq(t, "namespace", jobOf(t, p, "deploy").Environment.KubernetesNS, "my-namespace")
	for yml, want := range map[string]string{
		"j:\n  script: [x]\n  environment:\n    name: p\n    kubernetes:\n      dashboard: {colour: x}\n":              `jobs:j:environment:kubernetes:dashboard: unknown keyword "colour"`,
		"j:\n  script: [x]\n  environment:\n    name: p\n    kubernetes:\n      managed_resources: {enabled: maybe}\n": "jobs:j:environment:kubernetes:managed_resources:enabled should be a boolean",
	} {
		if errs := compileErrors(t, yml, Env{}); !strings.Contains(strings.Join(errs, "\n"), want) {
			t.Errorf("errors %q, want %q", errs, want)
		}
	}
}

// A job written with the name of a parallel job's instance: the later of
// the two replaces the earlier, as GitLab's hash of jobs does (its docs
// show such an override), with a warning.
func TestJobNamedLikeAParallelInstance(t *testing.T) {
	later := mustCompile(t, "build:\n  script: [b]\n  parallel:\n    matrix:\n      - V: [3, 4]\n'build: [3]':\n  script: [own]\n", Env{})
	eq(t, "explicit after", jobOf(t, later, "build: [3]").Script, []string{"own"})
	eq(t, "jobs", len(later.Jobs), 2)
	earlier := mustCompile(t, "'build: [3]':\n  script: [own]\nbuild:\n  script: [b]\n  parallel:\n    matrix:\n      - V: [3, 4]\n", Env{})
	eq(t, "generated after", jobOf(t, earlier, "build: [3]").Script, []string{"b"})
	eq(t, "jobs", len(earlier.Jobs), 2)
	for _, p := range []*Pipeline{later, earlier} {
		if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0].Msg, "as in GitLab") {
			t.Errorf("warnings %v", p.Warnings)
		}
	}
}

// A job named spec (GitLab's Crystal template has one) is a job: only a
// first document followed by a second is a header. A spec: of header
// keys in the configuration is still reported as a misplaced header.
func TestJobNamedSpec(t *testing.T) {
	p := mustCompile(t, "image: crystallang/crystal\nspec:\n  script: crystal spec\nformat:\n  script: crystal tool format --check\n", Env{})
	eq(t, "spec job", jobOf(t, p, "spec").Script, []string{"crystal spec"})

	p = mustCompile(t, "spec:\n  inputs:\n    cmd:\n      default: crystal spec\n---\n.base:\n  stage: build\nspec:\n  extends: .base\n  script: $[[ inputs.cmd ]]\n", Env{})
	j := jobOf(t, p, "spec")
	eq(t, "spec job after a header", []string{j.Stage, j.Script[0]}, []string{"build", "crystal spec"})

	errs := compileErrors(t, "spec:\n  inputs:\n    a:\ntest:\n  script: t\n", Env{})
	if len(errs) != 1 || !strings.Contains(errs[0], "spec: must be a YAML document of its own") {
		t.Errorf("a header inside the configuration: %q", errs)
	}
}

// A matrix expression names any matrix variable GitLab's does: letters,
// digits, "_" and "-" (its MatrixInterpolator).
func TestMatrixExpressionNames(t *testing.T) {
	p := mustCompile(t, `stages: [build, test]
build:
  stage: build
  parallel: {matrix: [{MY-VAR: [foo, bar], 2ND: [x]}]}
  script: b
test:
  stage: test
  parallel: {matrix: [{MY-VAR: [foo, bar], 2ND: [x]}]}
  needs:
    - job: build
      parallel: {matrix: [{MY-VAR: '$[[ matrix.MY-VAR ]]', 2ND: '$[[ matrix.2ND ]]'}]}
  script: t
`, branch("main"))
	for _, v := range []string{"foo", "bar"} {
		j := jobOf(t, p, "test: ["+v+", x]")
		if len(j.Needs) != 1 || j.Needs[0].Job != "build: ["+v+", x]" {
			t.Errorf("test %s needs %+v, want its build", v, j.Needs)
		}
	}
}

// TestAutoStopInWithVariables: auto_stop_in may name variables (GitLab
// expands it when the job deploys); a literal must still be a duration.
func TestAutoStopInWithVariables(t *testing.T) {
	p := mustCompile(t, "review:\n  script: x\n  variables:\n    TTL: 1 week\n  environment:\n    name: review\n    auto_stop_in: $TTL\n", Env{})
	if got := p.Jobs[0].Environment.AutoStopIn; got != "$TTL" {
		t.Errorf("auto_stop_in %q, want it kept for the deployment to expand", got)
	}
	errs := compileErrors(t, "review:\n  script: x\n  environment:\n    name: review\n    auto_stop_in: one fortnight\n", Env{})
	if len(errs) != 1 || !strings.Contains(errs[0], "auto_stop_in should be a duration or never") {
		t.Errorf("errors %v", errs)
	}
}

// TestVariableOptionsReadAsTheValue: options are read as the value is, so
// an unquoted 3.10 among them is the 3.1 the value is.
func TestVariableOptionsReadAsTheValue(t *testing.T) {
	p := mustCompile(t, "variables:\n  PY:\n    value: 3.10\n    options: [3.9, 3.10, '3.12']\ntest:\n  script: t\n", branch("main"))
	if v := p.Variables[0]; v.Value != "3.1" || strings.Join(v.Options, ",") != "3.9,3.1,3.12" {
		t.Errorf("PY = %q, options %q", v.Value, v.Options)
	}
}

// TestRemovedCoberturaReportWarns: artifacts:reports:cobertura still
// uploads, with a warning that GitLab refuses it since 16.0.
func TestRemovedCoberturaReportWarns(t *testing.T) {
	p := mustCompile(t, "test:\n  script: t\n  artifacts:\n    reports:\n      cobertura: cov.xml\n", branch("main"))
	if r := p.Jobs[0].Artifacts.Reports; len(r) != 1 || r[0].Type != "cobertura" {
		t.Errorf("reports %+v", r)
	}
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0].String(), ".gitlab-ci.yml:5:7: jobs:test:artifacts:reports:cobertura: GitLab removed this report type in 16.0") {
		t.Errorf("warnings %v", p.Warnings)
	}
}
