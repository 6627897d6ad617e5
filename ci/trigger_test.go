package ci

import (
	"context"
	"reflect"
	"strings"
	"testing"
)

func TestTriggerForms(t *testing.T) {
	p := mustCompile(t, `
build:
  stage: build
  script: [make]
simple:
  trigger: group/other
child:
  trigger:
    include: child.yml
    strategy: depend
    forward: {pipeline_variables: true}
after:
  stage: deploy
  script: [x]
dag:
  stage: deploy
  needs: [build, simple]
  script: [x]
dagbridge:
  stage: deploy
  needs: [{job: build, artifacts: false}]
  trigger: group/other
`, branch("main"))
	// A bridge has no artifacts: no job downloads from it.
	if d := p.Job("after").Dependencies; !reflect.DeepEqual(d, []string{"build"}) {
		t.Errorf("after depends on %q, want [build]", d)
	}
	if d := p.Job("dag").Dependencies; !reflect.DeepEqual(d, []string{"build"}) {
		t.Errorf("dag depends on %q, want [build]", d)
	}
	simple := p.Job("simple").Trigger
	if simple == nil || simple.Project != "group/other" || simple.Child() || !simple.ForwardYAMLVariables || simple.ForwardPipelineVariables {
		t.Errorf("simple trigger %+v", simple)
	}
	child := p.Job("child").Trigger
	want := []TriggerInclude{{Local: "child.yml", Entry: "child.yml", Pos: Pos{File: ".gitlab-ci.yml", Line: 9, Col: 14}}}
	if child == nil || !child.Child() || child.Strategy != "depend" || !child.ForwardPipelineVariables || !reflect.DeepEqual(child.Include, want) {
		t.Errorf("child trigger %+v", child)
	}
	// A bridge reads the dotenv reports of its dependencies.
	if j := p.Job("simple"); len(j.Script) != 0 || !reflect.DeepEqual(j.Dependencies, []string{"build"}) {
		t.Errorf("bridge has a script, or dependencies other than the earlier stage's job: %+v", j)
	}
	if d := p.Job("dagbridge").Dependencies; len(d) != 0 {
		t.Errorf("a bridge that needs build without artifacts depends on %q", d)
	}
}

func TestTriggerErrors(t *testing.T) {
	tests := []struct{ name, yml, want string }{
		{"script and trigger", "a:\n  script: x\n  trigger: p\n",
			`.gitlab-ci.yml:2:3: jobs:a: a trigger job cannot use script (allowed: allow_failure, environment, except, extends, inherit, interruptible, needs, only, parallel, resource_group, rules, stage, trigger, variables, when)`},
		{"image on a bridge", "a:\n  image: x\n  trigger: p\n",
			`.gitlab-ci.yml:2:3: jobs:a: a trigger job cannot use image (allowed: allow_failure, environment, except, extends, inherit, interruptible, needs, only, parallel, resource_group, rules, stage, trigger, variables, when)`},
		{"blank project", "a:\n  trigger: ''\n",
			`.gitlab-ci.yml:2:12: jobs:a:trigger can't be blank`},
		{"list", "a:\n  trigger: [p]\n",
			`.gitlab-ci.yml:2:12: jobs:a:trigger has to be either a string or a hash, found a list`},
		{"neither project nor include", "a:\n  trigger:\n    strategy: depend\n",
			`.gitlab-ci.yml:3:5: jobs:a:trigger config must specify either project or include`},
		{"unknown key", "a:\n  trigger:\n    project: p\n    include: x.yml\n",
			`.gitlab-ci.yml:3:5: jobs:a:trigger: unknown keyword "project" (allowed: include, strategy, forward)`},
		{"bad strategy", "a:\n  trigger:\n    project: p\n    strategy: wait\n",
			`.gitlab-ci.yml:4:15: jobs:a:trigger:strategy should be one of depend, mirror, found "wait"`},
		{"forward not boolean", "a:\n  trigger:\n    project: p\n    forward: {yaml_variables: maybe}\n",
			`.gitlab-ci.yml:4:31: jobs:a:trigger:forward:yaml_variables should be a boolean, found a string`},
		{"unknown forward", "a:\n  trigger:\n    project: p\n    forward: {secrets: true}\n",
			`.gitlab-ci.yml:4:15: jobs:a:trigger:forward: unknown keyword "secrets" (allowed: yaml_variables, pipeline_variables)`},
		{"too many includes", "a:\n  trigger:\n    include: [a.yml, b.yml, c.yml, d.yml]\n",
			`.gitlab-ci.yml:3:14: jobs:a:trigger:include config is too long (maximum is 3)`},
		{"artifact without job", "a:\n  trigger:\n    include:\n      - artifact: x.yml\n",
			`.gitlab-ci.yml:4:9: jobs:a:trigger:include: job must be provided when including configs from artifacts`},
		{"two kinds", "a:\n  trigger:\n    include:\n      - local: x.yml\n        template: y.yml\n",
			`.gitlab-ci.yml:4:9: jobs:a:trigger:include: each entry needs exactly one of local, remote, template, artifact, project or component, found local and template`},
		{"project without file", "a:\n  trigger:\n    include:\n      - project: g/p\n",
			`.gitlab-ci.yml:4:9: jobs:a:trigger:include: file is required with project`},
		{"job without artifact", "a:\n  trigger:\n    include:\n      - local: x.yml\n        job: b\n",
			`.gitlab-ci.yml:5:9: jobs:a:trigger:include: job is only allowed with artifact`},
		{"undefined artifact job", "a:\n  trigger:\n    include:\n      - artifact: x.yml\n        job: gen\n",
			`.gitlab-ci.yml:4:9: jobs:a:trigger:include: artifact job gen is not defined`},
		{"artifact job in the same stage", "gen:\n  script: x\na:\n  trigger:\n    include:\n      - artifact: x.yml\n        job: gen\n",
			`.gitlab-ci.yml:6:9: jobs:a:trigger:include: artifact job gen must run before a: it must be in an earlier stage or in needs`},
		{"artifact job in the same stage, not needed", "gen:\n  script: x\nother:\n  stage: build\n  script: x\na:\n  needs: [other]\n  trigger:\n    include:\n      - artifact: x.yml\n        job: gen\n",
			`.gitlab-ci.yml:10:9: jobs:a:trigger:include: artifact job gen must run before a: it must be in an earlier stage or in needs`},
		{"delayed bridge", "a:\n  when: delayed\n  trigger: p\n",
			`.gitlab-ci.yml:2:9: jobs:a:when should be one of on_success, on_failure, always, manual, found "delayed"`},
		{"inputs not a mapping", "a:\n  trigger:\n    project: p\n    inputs: [x]\n",
			`.gitlab-ci.yml:4:13: jobs:a:trigger:inputs should be a mapping, found a list`},
		// (default: with a trigger is a trigger job named default, as in
		// GitLab; needs alone does not make a job.)
		{"needs in default", "default:\n  needs: [a]\na:\n  script: x\n",
			`.gitlab-ci.yml:2:3: default: unknown keyword "needs" (allowed: after_script, artifacts, before_script, cache, hooks, id_tokens, image, interruptible, isolation, retry, services, tags, timeout)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := compileErrors(t, tt.yml, branch("main"))
			if len(got) != 1 || got[0] != tt.want {
				t.Errorf("errors:\n%q\nwant:\n%q", got, tt.want)
			}
		})
	}
}

// A bridge does not inherit default: keywords (it has none of them), as
// GitLab's Bridge entry; a needed artifact job is accepted.
func TestTriggerIgnoresDefaults(t *testing.T) {
	p := mustCompile(t, `
default:
  image: golang
  tags: [docker]
gen:
  stage: build
  script: [x]
a:
  needs: [gen]
  trigger:
    include: [{artifact: out.yml, job: gen}]
`, branch("main"))
	if j := p.Job("a"); j.Image != nil || j.Tags != nil || j.Trigger.Include[0].Job != "gen" {
		t.Errorf("bridge %+v", j)
	}
}

// interruptible is a processable keyword, so trigger jobs take it too.
func TestTriggerInterruptible(t *testing.T) {
	p := mustCompile(t, "child:\n  interruptible: true\n  trigger: {include: child.yml}\n", branch("main"), "child.yml", "a:\n  script: x\n")
	if j := jobOf(t, p, "child"); !j.Interruptible || j.Trigger == nil {
		t.Errorf("child: interruptible %v trigger %+v", j.Interruptible, j.Trigger)
	}
}

// TestTriggerArtifactFromAnEarlierStage: GitLab asks the artifact job to
// be in an earlier stage, whatever the trigger job's needs (GitLab's own
// qa pipeline relies on it); a needed job in the same stage does too.
func TestTriggerArtifactFromAnEarlierStage(t *testing.T) {
	p := mustCompile(t, `gen:
  stage: build
  script: x
other:
  stage: build
  script: x
a:
  needs: [other]
  trigger:
    include:
      - artifact: x.yml
        job: gen
same:
  stage: build
  needs: [gen]
  trigger:
    include:
      - artifact: x.yml
        job: gen
`, branch("main"))
	eq(t, "jobs", jobNames(p.Jobs), []string{"gen", "other", "same", "a"})
}

// TestIncludeLocalWildcards: only a path with * is a pattern (then with
// fnmatch's braces); one that matches nothing includes nothing, with a
// warning, as GitLab (which is silent).
func TestIncludeLocalWildcards(t *testing.T) {
	fsys := files(".gitlab-ci.yml", "include:\n  - local: ci/*.yml\n  - local: other/*.yml\n  - local: 'sub/{a,b}/*.yml'\nroot:\n  script: x\n",
		"ci/one.yml", "one:\n  script: x\n", "sub/a/x.yml", "ax:\n  script: x\n", "sub/b/y.yml", "by:\n  script: x\n")
	p, err := Compile(context.Background(), Source{FS: fsys, Path: ".gitlab-ci.yml"}, branch("main"))
	if err != nil {
		t.Fatal(err)
	}
	eq(t, "jobs", jobNames(p.Jobs), []string{"one", "ax", "by", "root"})
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0].Msg, "no local file matches other/*.yml") {
		t.Errorf("warnings %v", p.Warnings)
	}
	fsys = files(".gitlab-ci.yml", "include:\n  - local: 'ci/{a,b}.yml'\nroot:\n  script: x\n", "ci/a.yml", "a:\n  script: x\n", "ci/b.yml", "b:\n  script: x\n")
	if _, err := Compile(context.Background(), Source{FS: fsys, Path: ".gitlab-ci.yml"}, branch("main")); err == nil || !strings.Contains(err.Error(), "ci/{a,b}.yml") {
		t.Errorf("a path without * is a file name: %v", err)
	}
}
