package ci

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestJobRules(t *testing.T) {
	yml := `
variables:
  DEPLOY: "no"
workflow:
  rules:
    - when: always
build:
  stage: build
  script: x
  variables:
    LEVEL: job
  rules:
    - if: $CI_COMMIT_TAG
      when: never
    - if: $CI_COMMIT_BRANCH == "main" && $DEPLOY == "yes"
      when: manual
      allow_failure: true
      variables:
        LEVEL: rule
    - if: $CI_COMMIT_BRANCH =~ /^release\//
      when: delayed
      start_in: 10 minutes
      interruptible: true
    - if: $LEVEL == "job"
      when: on_success
`
	tests := []struct {
		name      string
		env       Env
		when      When
		rule      int
		allowFail bool
		level     string
		startIn   time.Duration
		interrupt bool
	}{
		{"tag: never", Env{Predefined: map[string]string{"CI_COMMIT_TAG": "v1"}}, Never, 0, false, "job", 0, false},
		{"job variables are visible to rules", branch("feature"), OnSuccess, 3, false, "job", 0, false},
		{"project variables beat YAML variables", Env{Predefined: map[string]string{"CI_COMMIT_BRANCH": "main"}, Variables: map[string]string{"DEPLOY": "yes"}},
			Manual, 1, true, "rule", 0, false},
		{"YAML variables beat predefined ones", Env{Predefined: map[string]string{"CI_COMMIT_BRANCH": "main", "DEPLOY": "yes"}}, OnSuccess, 3, false, "job", 0, false},
		{"delayed with start_in", branch("release/1.0"), Delayed, 2, false, "job", 10 * time.Minute, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustCompile(t, yml, tt.env)
			var j *Job
			if tt.when == Never {
				if len(p.Excluded) != 1 {
					t.Fatalf("excluded = %v", jobNames(p.Excluded))
				}
				j = p.Excluded[0]
			} else {
				j = jobOf(t, p, "build")
			}
			eq(t, "when", j.When, tt.when)
			eq(t, "rule", j.Rules.Matched, tt.rule)
			eq(t, "allow_failure", j.AllowFailure, tt.allowFail)
			eq(t, "LEVEL", varMap(j.Variables)["LEVEL"], tt.level)
			eq(t, "start_in", j.StartIn, tt.startIn)
			eq(t, "interruptible", j.Interruptible, tt.interrupt)
		})
	}
}

func TestRulesNoMatchExcludes(t *testing.T) {
	p := mustCompile(t, `
a:
  script: x
  rules:
    - if: $X == "1"
b:
  script: x
`, Env{})
	eq(t, "jobs", jobNames(p.Jobs), []string{"b"})
	eq(t, "excluded", jobNames(p.Excluded), []string{"a"})
	eq(t, "outcome", p.Excluded[0].Rules.String(), "no rule matched")
	eq(t, "b outcome", p.Jobs[0].Rules.String(), "no rules")
}

func TestRulesDefaultWhenIsJobWhen(t *testing.T) {
	p := mustCompile(t, `
a:
  script: x
  when: manual
  rules:
    - if: $CI_COMMIT_BRANCH
`, branch("main"))
	a := jobOf(t, p, "a")
	eq(t, "when", a.When, Manual)
	eq(t, "allow_failure (job-level manual)", a.AllowFailure, true)
}

func TestRulesChangesAndExists(t *testing.T) {
	yml := `
docs:
  script: x
  rules:
    - changes: [docs/**/*.md]
code:
  script: x
  rules:
    - changes:
        paths: [$DIR/**/*.go]
        compare_to: refs/heads/$BASE
docker:
  script: x
  rules:
    - exists: [Dockerfile, "**/Dockerfile"]
make:
  script: x
  rules:
    - if: $CI_COMMIT_BRANCH
      exists: [Makefile]
`
	var queries []ChangesQuery
	env := Env{
		Predefined: map[string]string{"CI_COMMIT_BRANCH": "main"},
		Variables:  map[string]string{"DIR": "cmd", "BASE": "main"},
		Changes: func(ctx context.Context, q ChangesQuery) (bool, error) {
			queries = append(queries, q)
			return q.CompareTo != "", nil
		},
		Exists: FSExists(files("build/Dockerfile", "FROM x", "README.md", "hi")),
	}
	p := mustCompile(t, yml, env)
	eq(t, "jobs", jobNames(p.Jobs), []string{"code", "docker"})
	eq(t, "queries", queries, []ChangesQuery{{Paths: []string{"docs/**/*.md"}}, {Paths: []string{"cmd/**/*.go"}, CompareTo: "refs/heads/main"}})

	// Without a Changes function there is no diff: changes is true, as in
	// GitLab for new branches and tags. Without Exists nothing exists.
	p = mustCompile(t, yml, Env{Predefined: map[string]string{"CI_COMMIT_BRANCH": "main"}})
	eq(t, "no diff", jobNames(p.Jobs), []string{"docs", "code"})
}

func TestRulesCallbackErrorsAreNotConfigErrors(t *testing.T) {
	boom := errors.New("git is gone")
	_, err := compileYAML(t, "a:\n  script: x\n  rules:\n    - changes: [x]\n", Env{
		Changes: func(context.Context, ChangesQuery) (bool, error) { return false, boom },
	})
	var list ErrorList
	if !errors.Is(err, boom) || errors.As(err, &list) {
		t.Fatalf("err = %v, want the callback error wrapped", err)
	}
	if !strings.Contains(err.Error(), "evaluating rules:changes at .gitlab-ci.yml:4:7") {
		t.Errorf("err = %v", err)
	}
}

func TestWorkflowRules(t *testing.T) {
	yml := `
variables:
  TARGET: dev
workflow:
  name: "Pipeline for $CI_COMMIT_REF_NAME"
  rules:
    - if: $CI_PIPELINE_SOURCE == "merge_request_event"
      when: never
    - if: $CI_COMMIT_BRANCH == "main"
      variables:
        TARGET: prod
    - if: $CI_COMMIT_BRANCH
a:
  script: x
  rules:
    - if: $TARGET == "prod"
b:
  script: x
  inherit:
    variables: false
`
	t.Run("variables from the matched rule reach jobs and their rules", func(t *testing.T) {
		p := mustCompile(t, yml, branch("main"))
		eq(t, "created", p.Created, true)
		eq(t, "workflow rule", p.WorkflowRule, 1)
		eq(t, "name", p.Name, "Pipeline for $CI_COMMIT_REF_NAME")
		eq(t, "jobs", jobNames(p.Jobs), []string{"a", "b"})
		eq(t, "a TARGET", varMap(jobOf(t, p, "a").Variables)["TARGET"], "prod")
		eq(t, "b inherits no globals", len(jobOf(t, p, "b").Variables), 0)
		eq(t, "pipeline vars", varMap(p.Variables)["TARGET"], "prod")
	})
	t.Run("other branches", func(t *testing.T) {
		p := mustCompile(t, yml, branch("feature"))
		eq(t, "rule", p.WorkflowRule, 2)
		eq(t, "jobs", jobNames(p.Jobs), []string{"b"})
		eq(t, "a excluded", jobNames(p.Excluded), []string{"a"})
	})
	t.Run("when never", func(t *testing.T) {
		p := mustCompile(t, yml, Env{Predefined: map[string]string{"CI_PIPELINE_SOURCE": "merge_request_event"}})
		eq(t, "created", [3]any{p.Created, p.Reason, len(p.Jobs)}, [3]any{false, "workflow:rules: rule 1 matched with when: never", 0})
	})
	t.Run("no rule matched", func(t *testing.T) {
		p := mustCompile(t, yml, Env{Predefined: map[string]string{"CI_COMMIT_TAG": "v1"}})
		eq(t, "created", [2]any{p.Created, p.Reason}, [2]any{false, "workflow:rules: no rule matched"})
	})
}

func TestPipelineOnlyPrePost(t *testing.T) {
	p := mustCompile(t, "a:\n  stage: .pre\n  script: x\nb:\n  script: x\n  rules:\n    - if: $B\n", Env{})
	eq(t, "created", [2]any{p.Created, p.Reason}, [2]any{false, "only jobs in .pre or .post stages are left after rules"})
	p = mustCompile(t, "b:\n  script: x\n  rules:\n    - if: $B\n", Env{})
	eq(t, "created", [2]any{p.Created, p.Reason}, [2]any{false, "no job is left after rules"})
}

func TestMultiplePipelinesWarning(t *testing.T) {
	p := mustCompile(t, "a:\n  script: x\n  rules:\n    - if: $A\n    - when: on_success\n", Env{})
	want := []Warning{{Pos: Pos{".gitlab-ci.yml", 5, 7}, Msg: "jobs:a may allow multiple pipelines to run for a single action due to `rules:when` clause with no `workflow:rules`"}}
	if !reflect.DeepEqual(p.Warnings, want) {
		t.Errorf("warnings = %v", p.Warnings)
	}
	p = mustCompile(t, "workflow:\n  rules: [{when: always}]\na:\n  script: x\n  rules:\n    - when: on_success\n", Env{})
	eq(t, "no warning with workflow rules", len(p.Warnings), 0)
}

func TestIncludeRules(t *testing.T) {
	yml := `
include:
  - local: deploy.yml
    rules:
      - if: $CI_COMMIT_BRANCH == "main"
  - local: never.yml
    rules:
      - if: $CI_COMMIT_BRANCH
        when: never
test:
  script: x
`
	extra := []string{"deploy.yml", "deploy:\n  stage: deploy\n  script: d\n", "never.yml", "x:\n  script: x\n"}
	eq(t, "main", jobNames(mustCompile(t, yml, branch("main"), extra...).Jobs), []string{"test", "deploy"})
	eq(t, "feature", jobNames(mustCompile(t, yml, branch("feature"), extra...).Jobs), []string{"test"})
}

// rules:needs replaces the job's needs when its rule matches (GitLab 16.4).
func TestRulesNeeds(t *testing.T) {
	yml := `build:
  stage: build
  script: b
lint:
  stage: build
  script: l
test:
  stage: test
  script: t
  needs: [build]
  rules:
    - if: $FAST == "1"
      needs: []
    - if: $CI_COMMIT_BRANCH == "main"
      needs: [build, {job: lint, artifacts: false}]
    - when: on_success
staged:
  stage: test
  script: s
  rules:
    - if: $CI_COMMIT_BRANCH == "main"
      needs: [lint]
`
	main := mustCompile(t, yml, branch("main"))
	if j := jobOf(t, main, "test"); len(j.Needs) != 2 || j.Needs[1].Job != "lint" || j.Needs[1].Artifacts || j.Scheduling != ScheduleDAG {
		t.Errorf("main: test needs %+v (%s)", j.Needs, j.Scheduling)
	}
	if j := jobOf(t, main, "test"); len(j.Dependencies) != 1 || j.Dependencies[0] != "build" {
		t.Errorf("main: test dependencies %q, want [build]", j.Dependencies)
	}
	if j := jobOf(t, main, "staged"); j.Scheduling != ScheduleDAG || len(j.Needs) != 1 || j.Needs[0].Job != "lint" {
		t.Errorf("main: staged %s needs %+v, want DAG on lint", j.Scheduling, j.Needs)
	}
	fast := Env{Predefined: branch("feature").Predefined, Variables: map[string]string{"FAST": "1"}}
	if j := jobOf(t, mustCompile(t, yml, fast), "test"); len(j.Needs) != 0 || j.Scheduling != ScheduleDAG {
		t.Errorf("FAST: test needs %+v (%s), want needs: []", j.Needs, j.Scheduling)
	}
	other := mustCompile(t, yml, branch("feature"))
	if j := jobOf(t, other, "test"); len(j.Needs) != 1 || j.Needs[0].Job != "build" {
		t.Errorf("feature: test needs %+v, want its own [build]", j.Needs)
	}
	if len(other.Jobs) != 3 {
		t.Errorf("feature: jobs %q", jobNames(other.Jobs))
	}
	for _, tt := range []struct{ yml, want string }{
		{"a:\n  script: x\n  rules:\n    - needs: [nope]\n", "jobs:a:rules:needs: undefined need: nope"},
		{"a:\n  script: x\n  rules:\n    - needs: [{pipeline: $P, job: b}]\n", "needs on other pipelines or projects go on the job, not in rules"},
		{"a:\n  stage: test\n  script: x\n  needs: []\nb:\n  stage: test\n  script: y\n  needs: [a]\n  rules:\n    - needs: [a]\nc:\n  stage: test\n  script: z\n  needs: []\n  rules:\n    - needs: [b]\n", ""},
		{"a:\n  stage: test\n  script: x\n  rules:\n    - needs: [b]\nb:\n  stage: test\n  script: y\n  rules:\n    - needs: [a]\n", "circular dependency"},
		{"include:\n  - local: b.yml\n    rules:\n      - needs: [a]\na:\n  script: x\n", `unknown keyword "needs"`},
		{"workflow:\n  rules:\n    - needs: 3\na:\n  script: x\n", "workflow:rules:needs"},
	} {
		_, err := compileYAML(t, tt.yml, branch("main"))
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%q: %v", tt.yml, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%q: error %v, want %q", tt.yml, err, tt.want)
		}
	}
}

// workflow:rules accept allow_failure and needs, as GitLab does
// (gitlab-org/gitlab#436473), and ignore them with a warning; an include's
// rules do not, and say so once.
func TestWorkflowRulesIgnoreJobKeys(t *testing.T) {
	p := mustCompile(t, "workflow:\n  rules:\n    - if: $CI_COMMIT_BRANCH\n      allow_failure: true\n      needs: [a]\na:\n  script: x\n", branch("main"))
	if j := jobOf(t, p, "a"); j.AllowFailure || len(j.Needs) != 0 {
		t.Errorf("job a: allow_failure %v, needs %+v: the workflow's rule reached it", j.AllowFailure, j.Needs)
	}
	var msgs []string
	for _, w := range p.Warnings {
		msgs = append(msgs, w.String())
	}
	want := []string{
		".gitlab-ci.yml:4:7: workflow:rules:allow_failure is ignored: a pipeline's rules do not make jobs allowed to fail (GitLab ignores it too)",
		".gitlab-ci.yml:5:7: workflow:rules:needs is ignored: a pipeline's rules do not set jobs' needs (GitLab ignores it too)",
	}
	if !reflect.DeepEqual(msgs, want) {
		t.Errorf("warnings %q, want %q", msgs, want)
	}
	errs := compileErrors(t, "include:\n  - local: b.yml\n    rules:\n      - needs: [a]\na:\n  script: x\n", branch("main"), "b.yml", "b:\n  script: y\n")
	if len(errs) != 1 || !strings.Contains(errs[0], `unknown keyword "needs"`) {
		t.Errorf("needs in an include's rules: %q, want one unknown keyword error", errs)
	}
}

// rules:exists with project (and ref) asks Env.ExistsIn; without it, the
// commit's own files.
func TestRulesExistsProject(t *testing.T) {
	var asked []string
	env := branch("main")
	env.Variables = map[string]string{"LIB": "group/lib"}
	env.Exists = func(ctx context.Context, p []string) (bool, error) { return false, nil }
	env.ExistsIn = func(ctx context.Context, project, ref string, p []string) (bool, error) {
		asked = append(asked, project+"@"+ref+":"+strings.Join(p, ","))
		return project == "group/lib" && ref == "", nil
	}
	p := mustCompile(t, `a:
  script: x
  rules:
    - exists: {paths: [Dockerfile], project: $LIB}
b:
  script: x
  rules:
    - exists: {paths: [Dockerfile], project: group/lib, ref: v1}
c:
  script: x
  rules:
    - exists: {paths: [Dockerfile]}
`, env)
	if got := jobNames(p.Jobs); len(got) != 1 || got[0] != "a" {
		t.Errorf("jobs %q, want [a]", got)
	}
	if want := "group/lib@:Dockerfile group/lib@v1:Dockerfile"; strings.Join(asked, " ") != want {
		t.Errorf("asked %q, want %q", asked, want)
	}
	errs := compileErrors(t, "a:\n  script: x\n  rules:\n    - exists: {paths: [f], ref: main}\n", branch("main"))
	if !strings.Contains(strings.Join(errs, "\n"), "exists:ref needs exists:project") {
		t.Errorf("ref without project: %q", errs)
	}
}

// TestJobPredefinedVariablesInRules: a job's rules and only/except see its
// own predefined variables, as GitLab's scoped_variables_for_pipeline_seed
// gives them: the environment's (its name expanded), CI_JOB_NAME_SLUG,
// CI_JOB_MANUAL, CI_NODE_TOTAL.
func TestJobPredefinedVariablesInRules(t *testing.T) {
	p := mustCompile(t, `
dast:
  script: x
  environment: {name: production}
  rules:
    - if: $CI_ENVIRONMENT_NAME == "production" && $CI_ENVIRONMENT_ACTION == "start"
      when: never
    - when: on_success
review:
  script: x
  environment: {name: review/$CI_COMMIT_REF_NAME, deployment_tier: development, url: https://r.example}
  rules:
    - if: $CI_ENVIRONMENT_NAME == "review/main" && $CI_ENVIRONMENT_TIER == "development" && $CI_ENVIRONMENT_URL
By Slug:
  script: x
  rules:
    - if: $CI_JOB_NAME_SLUG == "by-slug" && $CI_NODE_TOTAL == "1"
shard:
  script: x
  parallel: 2
  rules:
    - if: $CI_NODE_TOTAL == "2"
approve:
  script: x
  when: manual
  only:
    variables: [$CI_JOB_MANUAL == "true"]
`, branch("main"))
	eq(t, "jobs", jobNames(p.Jobs), []string{"review", "By Slug", "shard 1/2", "shard 2/2", "approve"})
}

// TestSlug: CI_COMMIT_REF_SLUG as GitLab's slugify makes it: lowercased,
// each byte that is not a-z or 0-9 a -, at most max bytes, no - at
// either end.
func TestSlug(t *testing.T) {
	for in, want := range map[string]string{"main": "main", "feature/Foo_bar": "feature-foo-bar", "a//b": "a--b",
		"-x-": "x", strings.Repeat("a", 70): strings.Repeat("a", 63), strings.Repeat("a", 62) + "/b": strings.Repeat("a", 62)} {
		if got := Slug(in, 63); got != want {
			t.Errorf("Slug(%q) = %q, want %q", in, got, want)
		}
	}
}
