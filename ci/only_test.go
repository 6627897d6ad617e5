package ci

import (
	"context"
	"strings"
	"testing"
)

// pipelineEnv is a pipeline's predefined variables: ref (a branch unless
// tag), source, project path.
func pipelineEnv(ref string, tag bool, source, project string) Env {
	p := map[string]string{"CI_COMMIT_REF_NAME": ref, "CI_PIPELINE_SOURCE": source, "CI_PROJECT_PATH": project}
	if tag {
		p["CI_COMMIT_TAG"] = ref
	} else {
		p["CI_COMMIT_BRANCH"] = ref
	}
	return Env{Predefined: p}
}

const onlyYAML = `
variables:
  DEPLOY: "yes"
plain:
  script: x
main-only:
  script: x
  only: [main]
main-string:
  script: x
  only: main
release-re:
  script: x
  only: ['/^release-\d+$/i']
tags-only:
  script: x
  only: [tags]
not-tags:
  script: x
  except: [tags]
schedules:
  script: x
  only: [schedules]
web-or-api:
  script: x
  only: [web, api]
not-main:
  script: x
  except: [main]
this-project:
  script: x
  only: [branches@grp/app]
other-project:
  script: x
  only: [branches@grp/fork]
vars-and-refs:
  script: x
  only:
    refs: [main]
    variables: [$DEPLOY == "yes", $FORCE]
vars-only:
  script: x
  only:
    variables: [$FORCE]
except-vars:
  script: x
  except:
    variables: [$DEPLOY == "yes"]
kube:
  script: x
  only:
    kubernetes: active
`

// TestOnlyExcept: GitLab's refs keywords, names, regexps, @project,
// variables (any), AND across keywords, except without only meaning
// branches and tags only, and kubernetes never active here.
func TestOnlyExcept(t *testing.T) {
	for _, c := range []struct {
		name string
		env  Env
		want []string
	}{
		{"push to main", pipelineEnv("main", false, "push", "grp/app"),
			[]string{"plain", "main-only", "main-string", "not-tags", "this-project", "vars-and-refs"}},
		{"push to release-12", pipelineEnv("Release-12", false, "push", "grp/app"),
			[]string{"plain", "release-re", "not-tags", "not-main", "this-project"}},
		{"tag v1", pipelineEnv("v1", true, "push", "grp/app"),
			[]string{"plain", "tags-only", "not-main"}},
		{"schedule on main", pipelineEnv("main", false, "schedule", "grp/app"),
			[]string{"plain", "main-only", "main-string", "not-tags", "schedules", "this-project", "vars-and-refs"}},
		{"web on feature", pipelineEnv("feature", false, "web", "grp/app"),
			[]string{"plain", "not-tags", "web-or-api", "not-main", "this-project"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := mustCompile(t, onlyYAML, c.env)
			eq(t, "jobs", jobNames(p.Jobs), c.want)
		})
	}
	// A pipeline variable makes $FORCE true: vars-only joins, and
	// except-vars still excludes (DEPLOY is yes).
	env := pipelineEnv("feature", false, "push", "grp/app")
	env.Variables = map[string]string{"FORCE": "1"}
	p := mustCompile(t, onlyYAML, env)
	eq(t, "with FORCE", jobNames(p.Jobs), []string{"plain", "not-tags", "not-main", "this-project", "vars-only"})
	env.Variables = map[string]string{"DEPLOY": "no"}
	p = mustCompile(t, onlyYAML, env)
	eq(t, "DEPLOY=no", jobNames(p.Jobs), []string{"plain", "not-tags", "not-main", "this-project", "except-vars"})
}

// TestOnlyChanges: only:changes asks the pipeline's diff; without one (a
// new branch, a tag) it is true, as in GitLab, so except:changes then
// excludes.
func TestOnlyChanges(t *testing.T) {
	yml := `
docs:
  script: x
  only:
    changes: [docs/**/*.md]
code:
  script: x
  except:
    changes: ["**/*.md"]
`
	env := pipelineEnv("main", false, "push", "g/p")
	var asked [][]string
	env.Changes = func(_ context.Context, q ChangesQuery) (bool, error) {
		asked = append(asked, q.Paths)
		return q.Paths[0] == "docs/**/*.md", nil
	}
	p := mustCompile(t, yml, env)
	eq(t, "with a diff", jobNames(p.Jobs), []string{"docs", "code"})
	if len(asked) != 2 {
		t.Errorf("changes asked %v", asked)
	}
	env.Changes = nil
	p = mustCompile(t, yml, env)
	eq(t, "without a diff", jobNames(p.Jobs), []string{"docs"})
	eq(t, "excluded", jobNames(p.Excluded), []string{"code"})
}

// TestOnlyThroughExtends: only/except come with extends like any key,
// and a hash form merges key by key.
func TestOnlyThroughExtends(t *testing.T) {
	const yml = `
.release:
  only:
    refs: [main]
    variables: [$RELEASE]
rel:
  extends: .release
  script: x
  only:
    refs: [tags]
`
	p := mustCompile(t, yml, pipelineEnv("v2", true, "push", "g/p"))
	// refs replaced by the job's, variables kept from the template: no
	// $RELEASE, so rel is out.
	eq(t, "jobs", jobNames(p.Jobs), []string{})
	env := pipelineEnv("v2", true, "push", "g/p")
	env.Variables = map[string]string{"RELEASE": "1"}
	p = mustCompile(t, yml, env)
	eq(t, "jobs with RELEASE", jobNames(p.Jobs), []string{"rel"})
}

// TestOnlyExceptOutcome: the job says which filter decided.
func TestOnlyExceptOutcome(t *testing.T) {
	p := mustCompile(t, onlyYAML, pipelineEnv("main", false, "push", "grp/app"))
	got := map[string]string{}
	for _, j := range append(p.Jobs, p.Excluded...) {
		got[j.Name] = j.Rules.String()
	}
	for name, want := range map[string]string{"plain": "no rules", "main-only": "only/except let it in",
		"not-main": "except matched", "tags-only": "only did not match"} {
		if got[name] != want {
			t.Errorf("%s: %q, want %q", name, got[name], want)
		}
	}
}

// TestRetryWhenCurrentReasons: GitLab's current failure reasons are
// accepted by retry:when (GitLab 19.1's included), unknown ones are not.
func TestRetryWhenCurrentReasons(t *testing.T) {
	p := mustCompile(t, `
a:
  script: x
  retry:
    max: 2
    when: [runner_interrupted, runner_external_dependency_failure, runner_configuration_error, no_updates_running, server_timeout_canceling]
`, Env{})
	eq(t, "when", strings.Join(p.Jobs[0].Retry.When, ","), "runner_interrupted,runner_external_dependency_failure,runner_configuration_error,no_updates_running,server_timeout_canceling")
	errs := compileErrors(t, "a:\n  script: x\n  retry:\n    max: 1\n    when: runner_reboot\n", Env{})
	if len(errs) != 1 || !strings.Contains(errs[0], `unknown failure reason "runner_reboot"`) {
		t.Errorf("errors %v", errs)
	}
}

// TestValidGitLabShapes: forms GitLab accepts that Berth once refused:
// needs as one mapping (GitLab wraps it), a cache list with a nested list
// from an anchor (flattened).
func TestValidGitLabShapes(t *testing.T) {
	p := mustCompile(t, `
.caches: &caches
  - key: deps
    paths: [vendor/]
  - key: tools
    paths: [bin/]
build:
  stage: build
  script: x
test:
  script: x
  needs:
    job: build
    artifacts: false
  cache:
    - *caches
    - key: own
      paths: [out/]
`, Env{})
	var test *Job
	for _, j := range p.Jobs {
		if j.Name == "test" {
			test = j
		}
	}
	if test == nil || len(test.Needs) != 1 || test.Needs[0].Job != "build" || test.Needs[0].Artifacts {
		t.Fatalf("needs %+v", test)
	}
	var keys []string
	for _, c := range test.Cache {
		keys = append(keys, c.Key)
	}
	eq(t, "cache keys", strings.Join(keys, ","), "deps,tools,own")
	errs := compileErrors(t, "a:\n  stage: build\n  script: x\nb:\n  script: x\n  needs: a\n", Env{})
	if len(errs) != 1 || !strings.Contains(errs[0], "needs should be a list (or one mapping)") {
		t.Errorf("a string needs: %v", errs)
	}
}

// TestAllProblemsAfterAFailedInclude: a missing include does not hide
// the file's other problems, and what the missing file could have
// defined (a template, a stage, a job) is not reported as missing.
func TestAllProblemsAfterAFailedInclude(t *testing.T) {
	errs := compileErrors(t, `include: missing.yml
stages: [build]
default:
  bogus: 1
a:
  extends: .from-the-include
  stage: lint
  needs: [job-in-include]
b:
  script: x
  when: sometimes
`, Env{})
	want := []string{
		`.gitlab-ci.yml:1:10: include: local file missing.yml does not exist`,
		`.gitlab-ci.yml:4:3: default: unknown keyword "bogus"`,
		`.gitlab-ci.yml:11:9: jobs:b:when should be one of`,
	}
	if len(errs) != len(want) {
		t.Fatalf("errors:\n%s\nwant %d", strings.Join(errs, "\n"), len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(errs[i], w) {
			t.Errorf("error %d: %q, want it to start with %q", i, errs[i], w)
		}
	}
}

// TestDefaultOnlyAndMergeRequests: a job without rules, only or except
// gets GitLab's only: [branches, tags], so a merge request pipeline has
// none of them; workflow:rules (or the job's rules) drop that default, as
// GitLab's compose! does.
func TestDefaultOnlyAndMergeRequests(t *testing.T) {
	const jobs = `plain:
  script: x
with-except:
  script: x
  except: [tags]
mr:
  script: x
  only: [merge_requests]
`
	mr := pipelineEnv("feature", false, "merge_request_event", "g/p")
	p := mustCompile(t, jobs, mr)
	eq(t, "merge request pipeline", jobNames(p.Jobs), []string{"mr"})
	p = mustCompile(t, jobs, pipelineEnv("feature", false, "push", "g/p"))
	eq(t, "branch pipeline", jobNames(p.Jobs), []string{"plain", "with-except"})
	p = mustCompile(t, jobs, pipelineEnv("v1", true, "push", "g/p"))
	eq(t, "tag pipeline", jobNames(p.Jobs), []string{"plain"})
	p = mustCompile(t, "workflow:\n  rules: [{when: always}]\n"+jobs, mr)
	eq(t, "merge request pipeline with workflow:rules", jobNames(p.Jobs), []string{"plain", "with-except", "mr"})
}

// TestExceptKeywordsExcludeEachOnItsOwn: every keyword of only: must
// match, but any keyword of except: leaves the job out (GitLab's
// all_of_only? and none_of_except?).
func TestExceptKeywordsExcludeEachOnItsOwn(t *testing.T) {
	const yml = `
deploy:
  stage: deploy
  script: x
build:
  script: x
  except:
    refs: [tags]
    variables: ['$CI_COMMIT_BRANCH == "main"']
release:
  script: x
  only:
    refs: [tags, main]
    variables: ['$RELEASE']
`
	for _, c := range []struct {
		name string
		env  Env
		vars map[string]string
		want []string
	}{
		{"tag", pipelineEnv("v1", true, "push", "grp/app"), nil, []string{"deploy"}},
		{"main", pipelineEnv("main", false, "push", "grp/app"), nil, []string{"deploy"}},
		{"feature", pipelineEnv("feature", false, "push", "grp/app"), nil, []string{"build", "deploy"}},
		{"tag with RELEASE", pipelineEnv("v1", true, "push", "grp/app"), map[string]string{"RELEASE": "1"}, []string{"release", "deploy"}},
		{"feature with RELEASE", pipelineEnv("feature", false, "push", "grp/app"), map[string]string{"RELEASE": "1"}, []string{"build", "deploy"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.env.Variables = c.vars
			p := mustCompile(t, yml, c.env)
			eq(t, "jobs", jobNames(p.Jobs), c.want)
		})
	}
}
