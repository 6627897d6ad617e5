package ci

import (
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runnerapi"
)

// TestIsolation pins the level each job asks for: the isolation keyword
// (own or from default:), the BERTH_ISOLATION variable as the job sees it,
// and the stronger of the two when both are given.
func TestIsolation(t *testing.T) {
	tests := []struct {
		name string
		yml  string
		env  Env
		want map[string]executor.Isolation // job → level ("" : asks nothing)
	}{
		{"nothing asked", "a:\n  script: x\n", Env{},
			map[string]executor.Isolation{"a": ""}},
		{"keyword", "a:\n  script: x\n  isolation: vm\n", Env{},
			map[string]executor.Isolation{"a": executor.IsolationVM}},
		{"explicit none", "a:\n  script: x\n  isolation: none\n", Env{},
			map[string]executor.Isolation{"a": executor.IsolationNone}},
		{"default keyword inherited, job's own wins", `
default:
  isolation: container
a:
  script: x
b:
  script: x
  isolation: none
c:
  script: x
  inherit:
    default: false
d:
  script: x
  inherit:
    default: [isolation]
`, Env{}, map[string]executor.Isolation{"a": executor.IsolationContainer, "b": executor.IsolationNone, "c": "", "d": executor.IsolationContainer}},
		{"keyword through extends", ".vm:\n  isolation: microvm\na:\n  extends: .vm\n  script: x\n", Env{},
			map[string]executor.Isolation{"a": executor.IsolationMicroVM}},
		{"global variable", `
variables:
  BERTH_ISOLATION: container
a:
  script: x
b:
  script: x
  variables:
    BERTH_ISOLATION: instance
c:
  script: x
  inherit:
    variables: false
d:
  script: x
  variables:
    BERTH_ISOLATION: ""
`, Env{}, map[string]executor.Isolation{"a": executor.IsolationContainer, "b": executor.IsolationInstance, "c": "", "d": ""}},
		{"variable in the mapping form", "a:\n  script: x\n  variables:\n    BERTH_ISOLATION:\n      value: vm\n      expand: false\n", Env{},
			map[string]executor.Isolation{"a": executor.IsolationVM}},
		{"stronger of keyword and variable wins", `
a:
  script: x
  isolation: vm
  variables:
    BERTH_ISOLATION: container
b:
  script: x
  isolation: cgroups
  variables:
    BERTH_ISOLATION: instance
`, Env{}, map[string]executor.Isolation{"a": executor.IsolationVM, "b": executor.IsolationInstance}},
		{"rules variables", `
a:
  script: x
  rules:
    - if: $CI_COMMIT_BRANCH == "main"
      variables:
        BERTH_ISOLATION: vm
    - when: on_success
`, branch("main"), map[string]executor.Isolation{"a": executor.IsolationVM}},
		{"matrix variables", `
a:
  script: x
  parallel:
    matrix:
      - BERTH_ISOLATION: [container, vm]
`, Env{}, map[string]executor.Isolation{"a: [container]": executor.IsolationContainer, "a: [vm]": executor.IsolationVM}},
		{"caller variables win over YAML ones", "variables:\n  BERTH_ISOLATION: vm\na:\n  script: x\n",
			Env{Variables: map[string]string{"BERTH_ISOLATION": "container"}},
			map[string]executor.Isolation{"a": executor.IsolationContainer}},
		{"caller variable with a keyword", "a:\n  script: x\n  isolation: container\nb:\n  script: x\n",
			Env{Variables: map[string]string{"BERTH_ISOLATION": "microvm"}},
			map[string]executor.Isolation{"a": executor.IsolationMicroVM, "b": executor.IsolationMicroVM}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustCompile(t, tt.yml, tt.env)
			if len(p.Jobs) != len(tt.want) {
				t.Fatalf("jobs %v, want %d", jobNames(p.Jobs), len(tt.want))
			}
			for name, want := range tt.want {
				eq(t, name+" isolation", jobOf(t, p, name).Isolation, want)
			}
		})
	}
}

func TestIsolationErrors(t *testing.T) {
	tests := []struct {
		name string
		yml  string
		env  Env
		want []string
	}{
		{"bad keyword", "build:\n  script: make\n  isolation: vms\n", Env{},
			[]string{`.gitlab-ci.yml:3:14: jobs:build:isolation should be one of none, cgroups, container, microvm, vm, instance, found "vms"`}},
		{"keyword not a string", "build:\n  script: make\n  isolation: [vm]\n", Env{},
			[]string{`.gitlab-ci.yml:3:14: jobs:build:isolation should be a string, found a list`}},
		{"bad default keyword", "default:\n  isolation: VM\nbuild:\n  script: make\n", Env{},
			// As for every default keyword: once for default:, once for
			// each job inheriting it.
			[]string{`.gitlab-ci.yml:2:14: default:isolation should be one of none, cgroups, container, microvm, vm, instance, found "VM"`,
				`.gitlab-ci.yml:2:14: jobs:build:isolation should be one of none, cgroups, container, microvm, vm, instance, found "VM"`}},
		{"bad global variable", "variables:\n  BERTH_ISOLATION: kvm\nbuild:\n  script: make\n", Env{},
			[]string{`.gitlab-ci.yml:2:20: variables:BERTH_ISOLATION should be one of none, cgroups, container, microvm, vm, instance, found "kvm"`}},
		{"bad job variable (mapping form)", "build:\n  script: make\n  variables:\n    BERTH_ISOLATION:\n      value: $LEVEL\n", Env{},
			[]string{`.gitlab-ci.yml:5:14: jobs:build:variables:BERTH_ISOLATION:value should be one of none, cgroups, container, microvm, vm, instance, found "$LEVEL"`}},
		{"bad rules variable", "build:\n  script: make\n  rules:\n    - variables:\n        BERTH_ISOLATION: jail\n", Env{},
			[]string{`.gitlab-ci.yml:5:26: jobs:build:rules:variables:BERTH_ISOLATION should be one of none, cgroups, container, microvm, vm, instance, found "jail"`}},
		{"bad matrix value", "build:\n  script: make\n  parallel:\n    matrix:\n      - BERTH_ISOLATION: [vm, zone]\n", Env{},
			[]string{`.gitlab-ci.yml:5:31: jobs:build:parallel:matrix:BERTH_ISOLATION should be one of none, cgroups, container, microvm, vm, instance, found "zone"`}},
		{"bad caller variable", "build:\n  script: make\n", Env{Variables: map[string]string{"BERTH_ISOLATION": "strong"}},
			[]string{`.gitlab-ci.yml: variable BERTH_ISOLATION (a project or pipeline variable) should be one of none, cgroups, container, microvm, vm, instance, found "strong"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eq(t, "errors", compileErrors(t, tt.yml, tt.env), tt.want)
		})
	}
}

// TestIsolationPayload: the runner learns the level through one
// BERTH_ISOLATION variable, last, public; a job that asks nothing gets
// none.
func TestIsolationPayload(t *testing.T) {
	p := mustCompile(t, `
a:
  script: x
  isolation: vm
  variables:
    BERTH_ISOLATION: container
    OTHER: "1"
b:
  script: x
`, Env{})
	vars := func(name string) []runnerapi.Variable {
		parts, err := jobOf(t, p, name).RunnerPayload(time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return parts.Variables
	}
	got := vars("a")
	var iso []runnerapi.Variable
	for _, v := range got {
		if v.Key == runnerapi.IsolationVariable {
			iso = append(iso, v)
		}
	}
	eq(t, "a: BERTH_ISOLATION variables", iso, []runnerapi.Variable{{Key: "BERTH_ISOLATION", Value: "vm", Public: true}})
	eq(t, "a: last variable", got[len(got)-1].Key, runnerapi.IsolationVariable)
	for _, v := range vars("b") {
		if v.Key == runnerapi.IsolationVariable {
			t.Errorf("b asks nothing but has %+v", v)
		}
	}
}

func TestIsolationJSONRoundTrip(t *testing.T) {
	p := mustCompile(t, "a:\n  script: x\n  isolation: instance\n", Env{})
	b, err := jobOf(t, p, "a").MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var j Job
	if err := j.UnmarshalJSON(b); err != nil {
		t.Fatal(err)
	}
	eq(t, "isolation", j.Isolation, executor.IsolationInstance)
}
