package ci

import (
	"testing"
)

func needNames(j *Job) []string {
	out := []string{}
	for _, n := range j.Needs {
		out = append(out, n.Job)
	}
	return out
}

func TestParallelNaming(t *testing.T) {
	p := mustCompile(t, `
unit:
  script: x
  parallel: 3
deploy:
  stage: deploy
  script: x
  parallel:
    matrix:
      - PROVIDER: aws
        STACK: [monitoring, app1]
      - PROVIDER: [gcp, vultr]
        STACK: [data]
      - VERSION: 1.22
`, Env{})
	eq(t, "jobs", jobNames(p.Jobs), []string{
		"unit 1/3", "unit 2/3", "unit 3/3",
		"deploy: [aws, monitoring]", "deploy: [aws, app1]", "deploy: [gcp, data]", "deploy: [vultr, data]", "deploy: [1.22]",
	})
	u := jobOf(t, p, "unit 2/3")
	eq(t, "unit index", [3]any{u.BaseName, u.NodeIndex, u.NodeTotal}, [3]any{"unit", 2, 3})
	d := jobOf(t, p, "deploy: [gcp, data]")
	eq(t, "matrix vars", varMap(d.Variables), map[string]string{"PROVIDER": "gcp", "STACK": "data"})
	eq(t, "matrix", varKeys(d.Matrix), []string{"PROVIDER", "STACK"})
	eq(t, "node", [2]int{d.NodeIndex, d.NodeTotal}, [2]int{3, 5})
}

func TestNeedsResolution(t *testing.T) {
	p := mustCompile(t, `
stages: [build, test, deploy]
compile:
  stage: build
  script: x
  parallel:
    matrix:
      - OS: [linux, windows]
        ARCH: [amd64, arm64]
lint:
  stage: build
  script: x
  parallel: 2
all:
  stage: test
  script: x
  needs: [compile, lint]
one:
  stage: test
  script: x
  needs:
    - job: compile
      parallel:
        matrix:
          - OS: linux
            ARCH: [arm64]
    - "lint 2/2"
nothing:
  stage: deploy
  script: x
  needs: []
noart:
  stage: deploy
  script: x
  needs:
    - job: all
      artifacts: false
    - job: one
    - job: ghost
      optional: true
samestage:
  stage: deploy
  script: x
  needs: [nothing]
`, Env{})
	eq(t, "all", needNames(jobOf(t, p, "all")), []string{
		"compile: [linux, amd64]", "compile: [linux, arm64]", "compile: [windows, amd64]", "compile: [windows, arm64]",
		"lint 1/2", "lint 2/2"})
	eq(t, "one", needNames(jobOf(t, p, "one")), []string{"compile: [linux, arm64]", "lint 2/2"})
	n := jobOf(t, p, "nothing")
	eq(t, "nothing", [3]any{n.Scheduling, n.Needs, n.Dependencies}, [3]any{ScheduleDAG, []Need{}, []string(nil)})
	na := jobOf(t, p, "noart")
	eq(t, "noart needs", needNames(na), []string{"all", "one"})
	eq(t, "noart artifacts", na.Needs[0].Artifacts, false)
	eq(t, "noart deps (needs with artifacts)", na.Dependencies, []string{"one"})
	eq(t, "same stage", needNames(jobOf(t, p, "samestage")), []string{"nothing"})
	eq(t, "stage scheduling", jobOf(t, p, "lint 1/2").Scheduling, ScheduleStage)
}

func TestDependencies(t *testing.T) {
	p := mustCompile(t, `
b1:
  stage: build
  script: x
b2:
  stage: build
  script: x
  parallel: 2
t:
  stage: test
  script: x
d:
  stage: deploy
  script: x
  dependencies: [b2]
none:
  stage: deploy
  script: x
  dependencies: []
`, Env{})
	eq(t, "default: every earlier-stage job", jobOf(t, p, "t").Dependencies, []string{"b1", "b2 1/2", "b2 2/2"})
	eq(t, "explicit, expanded", jobOf(t, p, "d").Dependencies, []string{"b2 1/2", "b2 2/2"})
	eq(t, "explicit empty", jobOf(t, p, "none").Dependencies, []string{})
}

func TestOptionalNeedOnExcludedJob(t *testing.T) {
	p := mustCompile(t, `
build:
  stage: build
  script: x
  rules:
    - if: $NEVER
test:
  script: x
  needs:
    - job: build
      optional: true
`, Env{})
	eq(t, "test needs", jobOf(t, p, "test").Needs, []Need{})
	eq(t, "excluded", jobNames(p.Excluded), []string{"build"})
}

func TestMatrixRulesUseMatrixVariables(t *testing.T) {
	p := mustCompile(t, `
deploy:
  script: x
  parallel:
    matrix:
      - ENV: [staging, production]
  rules:
    - if: $ENV == "production"
      when: manual
    - when: on_success
after:
  stage: deploy
  script: x
  needs: [deploy]
workflow:
  rules:
    - when: always
`, Env{})
	eq(t, "staging", jobOf(t, p, "deploy: [staging]").When, OnSuccess)
	prod := jobOf(t, p, "deploy: [production]")
	eq(t, "production", [2]any{prod.When, prod.AllowFailure}, [2]any{Manual, false})
	eq(t, "needs on matrix job", needNames(jobOf(t, p, "after")), []string{"deploy: [staging]", "deploy: [production]"})
}

// TestDependenciesWithNeeds: GitLab checks dependencies against needs only
// when needs lists jobs; a job with needs: [] starts at once and downloads
// nothing, and with needs only the needs with artifacts are downloaded
// (Ci::BuildDependencies#from_needs).
func TestDependenciesWithNeeds(t *testing.T) {
	p := mustCompile(t, `
build:
  stage: build
  script: x
lint:
  stage: build
  script: x
deploy:
  stage: deploy
  needs: []
  dependencies: [build]
  script: x
report:
  stage: deploy
  needs: [{job: build, artifacts: false}, lint]
  dependencies: [build, lint]
  script: x
`, Env{})
	eq(t, "needs: [] downloads nothing", jobOf(t, p, "deploy").Dependencies, []string{})
	eq(t, "needs without artifacts are not downloaded", jobOf(t, p, "report").Dependencies, []string{"lint"})
}
