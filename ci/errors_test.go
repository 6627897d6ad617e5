package ci

import (
	"reflect"
	"strings"
	"testing"
)

// TestErrorMessages pins the exact file:line:col: message of a
// representative set of mistakes.
func TestErrorMessages(t *testing.T) {
	tests := []struct {
		name  string
		yml   string
		extra []string
		want  []string
	}{
		{"unknown keyword", "build:\n  script: make\n  scrpt: x\n",
			nil, []string{`.gitlab-ci.yml:3:3: jobs:build: unknown keyword "scrpt"`}},
		{"unknown stage", "build:\n  stage: tst\n  script: make\n",
			nil, []string{`.gitlab-ci.yml:2:10: jobs:build: chosen stage tst does not exist; available stages are .pre, build, test, deploy, .post`}},
		{"default stage missing", "stages: [build]\ntest:\n  script: t\n",
			nil, []string{`.gitlab-ci.yml:2:1: jobs:test: chosen stage test does not exist; available stages are .pre, build, .post`}},
		{"no script", "build:\n  image: golang\n",
			nil, []string{`.gitlab-ci.yml:1:1: jobs:build config should implement the script: keyword`}},
		{"script blank", "build:\n  script: []\n",
			nil, []string{`.gitlab-ci.yml:2:11: jobs:build script can't be blank`}},
		{"script empty string", "build:\n  script: \"\"\n",
			nil, []string{`.gitlab-ci.yml:2:11: jobs:build script can't be blank`}},
		{"job named by a boolean", "true:\n  script: x\nbuild:\n  script: y\n",
			nil, []string{`.gitlab-ci.yml:1:1: jobs:true name should be a Symbol: GitLab's YAML loader reads the unquoted key true as a boolean; quote it`}},
		{"job named by a YAML 1.1 boolean", "on:\n  script: x\nbuild:\n  script: y\n",
			nil, []string{`.gitlab-ci.yml:1:1: jobs:on name should be a Symbol: GitLab's YAML loader reads the unquoted key on as a boolean; quote it`}},
		{"job named by a number", "build:\n  script: y\n1:\n  script: x\n",
			nil, []string{`.gitlab-ci.yml:3:1: jobs:1 name should be a Symbol: GitLab's YAML loader reads the unquoted key 1 as a number; quote it`}},
		{"job named null", "~:\n  script: x\nbuild:\n  script: y\n",
			nil, []string{`.gitlab-ci.yml:1:1: jobs:~ name should be a Symbol: GitLab's YAML loader reads the unquoted key ~ as null; quote it`}},
		{"job named by a number that looks hidden", "build:\n  script: y\n.5:\n  script: x\n",
			nil, []string{`.gitlab-ci.yml:3:1: jobs:.5 name should be a Symbol: GitLab's YAML loader reads the unquoted key .5 as a number; quote it`}},
		{"symbol key is its name", ":build:\n  stage: tst\n  script: x\n",
			nil, []string{`.gitlab-ci.yml:2:10: jobs:build: chosen stage tst does not exist; available stages are .pre, build, test, deploy, .post`}},
		{"script null", "build:\n  script: null\n",
			nil, []string{`.gitlab-ci.yml:2:11: jobs:build script can't be blank`}},
		{"script with nothing after it", "build:\n  script:\n  stage: test\n",
			nil, []string{`.gitlab-ci.yml:2:10: jobs:build script can't be blank`}},
		{"script emptied in the job extending", ".base:\n  script: make\nbuild:\n  extends: .base\n  script: ~\n",
			nil, []string{`.gitlab-ci.yml:5:11: jobs:build script can't be blank`}},
		{"rules blank", "build:\n  script: x\n  rules: []\n",
			nil, []string{`.gitlab-ci.yml:3:10: jobs:build:rules config can't be blank`}},
		{"rule blank", "build:\n  script: x\n  rules:\n    - if: $A\n    - {}\n",
			nil, []string{`.gitlab-ci.yml:5:7: jobs:build:rules:rule config can't be blank`}},
		{"workflow rules blank", "workflow:\n  rules: []\nbuild:\n  script: x\n",
			nil, []string{`.gitlab-ci.yml:2:10: workflow:rules config can't be blank`}},
		{"environment blank", "deploy:\n  script: x\n  environment: \"\"\n",
			nil, []string{`.gitlab-ci.yml:3:16: jobs:deploy:environment: name is required`}},
		{"environment name with a colon", "deploy:\n  script: x\n  environment:\n    name: review:$CI_COMMIT_REF_SLUG\n",
			nil, []string{`.gitlab-ci.yml:4:11: jobs:deploy:environment name can contain only letters, digits, '-', '_', '/', '$', '{', '}', '.', and spaces, but it cannot start or end with '/' (found "review:$CI_COMMIT_REF_SLUG")`}},
		{"environment name ends with a slash", "deploy:\n  script: x\n  environment: review/\n",
			nil, []string{`.gitlab-ci.yml:3:16: jobs:deploy:environment name can contain only letters, digits, '-', '_', '/', '$', '{', '}', '.', and spaces, but it cannot start or end with '/' (found "review/")`}},
		{"workflow name too long", "workflow:\n  name: " + strings.Repeat("é", 256) + "\nbuild:\n  script: x\n",
			nil, []string{`.gitlab-ci.yml:2:9: workflow name is too long (maximum is 255 characters, found 256)`}},
		{"script line is a date", "build:\n  script:\n    - 2024-01-15\n",
			nil, []string{`.gitlab-ci.yml:3:7: jobs:build:script line should be a string, found a date: quote it`}},
		{"script line is a mapping", "build:\n  script:\n    - echo: hi\n",
			nil, []string{`.gitlab-ci.yml:3:7: jobs:build:script line is a mapping, not a string: quote the line if it contains ": "`}},
		{"bad when", "build:\n  script: make\n  when: sometimes\n",
			nil, []string{`.gitlab-ci.yml:3:9: jobs:build:when should be one of on_success, on_failure, always, manual, delayed, found "sometimes"`}},
		{"delayed without start_in", "build:\n  script: make\n  when: delayed\n",
			nil, []string{`.gitlab-ci.yml:3:9: jobs:build: when: delayed needs start_in`}},
		{"start_in without delayed", "build:\n  script: make\n  start_in: 5 minutes\n",
			nil, []string{`.gitlab-ci.yml:3:3: jobs:build: start_in is only allowed with when: delayed`}},
		{"start_in with rules", "build:\n  script: make\n  rules:\n    - when: delayed\n      start_in: 1h\n  start_in: 5 minutes\n",
			nil, []string{`.gitlab-ci.yml:6:3: jobs:build: start_in may not be used with rules; set it in the rule`}},
		{"start_in over a week", "build:\n  script: make\n  when: delayed\n  start_in: 8 days\n",
			nil, []string{`.gitlab-ci.yml:4:13: jobs:build:start_in should not exceed 1 week`}},
		{"bad timeout", "build:\n  script: make\n  timeout: forever\n",
			nil, []string{`.gitlab-ci.yml:3:12: jobs:build:timeout should be a duration like "1h 30m", found "forever"`}},
		{"retry too high", "build:\n  script: make\n  retry: 3\n",
			nil, []string{`.gitlab-ci.yml:3:10: jobs:build:retry should be 0, 1 or 2, found 3`}},
		{"undefined need", "test:\n  script: t\n  needs: [buld]\n",
			nil, []string{`.gitlab-ci.yml:3:11: jobs:test:needs: undefined need: buld`}},
		{"need in later stage", "build:\n  stage: deploy\n  script: b\ntest:\n  stage: test\n  script: t\n  needs: [build]\n",
			nil, []string{`.gitlab-ci.yml:7:11: jobs:test:needs: need build is not defined in current or prior stages (it is in stage deploy, after test)`}},
		{"needs cycle", "a:\n  script: a\n  needs: [b]\nb:\n  script: b\n  needs: [a]\n",
			nil, []string{`.gitlab-ci.yml:6:11: jobs:b:needs: circular dependency: a → b → a`}},
		{"duplicate need", "a:\n  script: a\nb:\n  script: b\n  needs: [a, a]\n",
			nil, []string{`.gitlab-ci.yml:5:14: jobs:b:needs: duplicate need: a`}},
		{"undefined dependency", "test:\n  script: t\n  dependencies: [nope]\n",
			nil, []string{`.gitlab-ci.yml:3:17: jobs:test:dependencies: undefined dependency: nope`}},
		{"dependency in later stage", "test:\n  script: t\n  dependencies: [d]\nd:\n  stage: deploy\n  script: d\n",
			nil, []string{`.gitlab-ci.yml:3:17: jobs:test:dependencies: dependency d is not defined in current or prior stages`}},
		{"dependencies outside needs", "test:\n  script: t\n  needs: [a]\n  dependencies: [b]\na:\n  stage: build\n  script: a\nb:\n  stage: build\n  script: b\n",
			nil, []string{`.gitlab-ci.yml:4:17: jobs:test:dependencies: b should be part of needs`}},
		{"bad expression", "test:\n  script: t\n  rules:\n    - if: $A = \"x\"\n",
			nil, []string{`.gitlab-ci.yml:4:11: jobs:test:rules:if: invalid expression "$A = \"x\"": unknown token at "= \"x\""`}},
		{"invalid regex", "test:\n  script: t\n  rules:\n    - if: $A =~ /(/\n",
			nil, []string{`.gitlab-ci.yml:4:11: jobs:test:rules:if: invalid expression "$A =~ /(/": invalid regular expression /(/: missing closing ): ` + "`(`"}},
		{"unknown extends", "test:\n  extends: .missing\n  script: t\n",
			nil, []string{`.gitlab-ci.yml:2:12: test: unknown key in extends: .missing`}},
		{"extends cycle", ".a:\n  extends: .b\n.b:\n  extends: .a\ntest:\n  extends: .a\n  script: t\n",
			nil, []string{`.gitlab-ci.yml:4:12: .a: circular dependency detected in extends: .a → .b → .a`}},
		{"extends nested too deep, the deepest job first", "test:\n  extends: .j11\n.j0:\n  script: x\n.j1:\n  extends: .j0\n.j2:\n  extends: .j1\n.j3:\n  extends: .j2\n.j4:\n  extends: .j3\n.j5:\n  extends: .j4\n.j6:\n  extends: .j5\n.j7:\n  extends: .j6\n.j8:\n  extends: .j7\n.j9:\n  extends: .j8\n.j10:\n  extends: .j9\n.j11:\n  extends: .j10\n",
			nil, []string{`.gitlab-ci.yml:26:12: .j11: nesting too deep in extends (more than 10 levels)`}},
		{"extends nested too deep, bases first", ".j0:\n  script: x\n.j1:\n  extends: .j0\n.j2:\n  extends: .j1\n.j3:\n  extends: .j2\n.j4:\n  extends: .j3\n.j5:\n  extends: .j4\n.j6:\n  extends: .j5\n.j7:\n  extends: .j6\n.j8:\n  extends: .j7\n.j9:\n  extends: .j8\n.j10:\n  extends: .j9\n.j11:\n  extends: .j10\ntest:\n  extends: .j11\n",
			nil, []string{`.gitlab-ci.yml:24:12: .j11: nesting too deep in extends (more than 10 levels)`}},
		{"missing reference", "test:\n  script: !reference [.nope, script]\n",
			nil, []string{`.gitlab-ci.yml:2:11: !reference [.nope, script] could not be found`}},
		{"circular reference", ".a:\n  script: !reference [.b, script]\n.b:\n  script: !reference [.a, script]\ntest:\n  script: !reference [.a, script]\n",
			nil, []string{`.gitlab-ci.yml:2:11: !reference [.b, script]: circular references detected`}},
		{"missing include", "include: missing.yml\ntest:\n  script: t\n",
			nil, []string{`.gitlab-ci.yml:1:10: include: local file missing.yml does not exist`}},
		{"include cycle", "include: a.yml\ntest:\n  script: t\n",
			[]string{"a.yml", "include: b.yml\n", "b.yml", "include:\n  - local: /a.yml\n"},
			[]string{`b.yml:2:12: include cycle: a.yml → b.yml → a.yml`}},
		{"error inside include", "include: a.yml\ntest:\n  script: t\n",
			[]string{"a.yml", "lint:\n  script: l\n  tags: docker\n"},
			[]string{`a.yml:3:9: jobs:lint:tags should be a list of strings, found a string`}},
		{"include not yaml", "include: a.txt\ntest:\n  script: t\n",
			nil, []string{`.gitlab-ci.yml:1:10: include: local file a.txt does not have a .yml or .yaml extension`}},
		{"remote include", "include: https://example.test/ci.yml\ntest:\n  script: t\n",
			nil, []string{`.gitlab-ci.yml:1:10: include:remote https://example.test/ci.yml cannot be resolved: nothing here fetches remote includes (no include resolver)`}},
		{"template include", "include:\n  - template: Go.gitlab-ci.yml\ntest:\n  script: t\n",
			nil, []string{`.gitlab-ci.yml:2:15: include:template Go.gitlab-ci.yml cannot be resolved: nothing here fetches template includes (no include resolver)`}},
		{"only with rules", "test:\n  script: t\n  rules: [{when: always}]\n  only: [main]\n",
			nil, []string{".gitlab-ci.yml:4:3: jobs:test config key may not be used with `rules`: only"}},
		{"only bad regexp", "test:\n  script: t\n  only: ['/a(/']\n",
			nil, []string{`.gitlab-ci.yml:3:9: jobs:test:only: "/a(/" is not a valid regular expression: error parsing regexp: missing closing ): ` + "`a(`"}},
		{"only bad key", "test:\n  script: t\n  except:\n    refs: [main]\n    branch: [x]\n",
			nil, []string{`.gitlab-ci.yml:5:5: jobs:test:except: unknown keyword "branch" (allowed: refs, variables, changes, kubernetes)`}},
		{"only bad kubernetes", "test:\n  script: t\n  only:\n    kubernetes: passive\n",
			nil, []string{`.gitlab-ci.yml:4:17: jobs:test:only:kubernetes should be active, found "passive"`}},
		{"job description", "test:\n  script: t\n  variables:\n    A:\n      value: x\n      description: d\n",
			nil, []string{`.gitlab-ci.yml:6:7: jobs:test:variables:A: unknown keyword "description" (allowed: value, expand)`}},
		{"option not in options", "variables:\n  A:\n    value: x\n    options: [y, z]\ntest:\n  script: t\n",
			nil, []string{`.gitlab-ci.yml:4:14: variables:A: value "x" must be one of the options`}},
		{"parallel too big", "test:\n  script: t\n  parallel: 500\n",
			nil, []string{`.gitlab-ci.yml:3:13: jobs:test:parallel should be between 1 and 200, found 500`}},
		{"matrix name clash", "test:\n  script: t\n  parallel:\n    matrix:\n      - A: [x, x]\n",
			nil, []string{`.gitlab-ci.yml:5:7: jobs:test:parallel: generated job name "test: [x]" is already used (at .gitlab-ci.yml:5:7)`}},
		{"cache key slash", "test:\n  script: t\n  cache:\n    key: a/b\n",
			nil, []string{`.gitlab-ci.yml:4:10: jobs:test:cache:key cannot contain the "/" character`}},
		{"too many caches", "test:\n  script: t\n  cache: [{}, {}, {}, {}, {}]\n",
			nil, []string{`.gitlab-ci.yml:3:10: jobs:test:cache: no more than 4 caches can be defined, found 5`}},
		{"artifacts when", "test:\n  script: t\n  artifacts:\n    when: sometimes\n",
			nil, []string{`.gitlab-ci.yml:4:11: jobs:test:artifacts:when should be one of on_success, on_failure, always, found "sometimes"`}},
		{"unknown report", "test:\n  script: t\n  artifacts:\n    reports:\n      junk: x.xml\n",
			nil, []string{`.gitlab-ci.yml:5:7: jobs:test:artifacts:reports: unknown report type "junk"`}},
		{"exit codes", "test:\n  script: t\n  allow_failure:\n    exit_codes: [one]\n",
			nil, []string{`.gitlab-ci.yml:4:18: jobs:test:allow_failure:exit_codes should be an integer, found a string`}},
		{"job not a mapping", "test: [a, b]\n",
			nil, []string{`.gitlab-ci.yml:1:1: jobs:test config should be a mapping of keywords, found a list`}},
		{"only hidden jobs", ".hidden:\n  script: x\n",
			nil, []string{`.gitlab-ci.yml:1:1: jobs config should contain at least one visible job`}},
		{"rule delayed without start_in", "test:\n  script: t\n  rules:\n    - if: $A\n      when: delayed\n",
			nil, []string{`.gitlab-ci.yml:4:7: jobs:test:rules: when: delayed needs start_in`}},
		{"unknown rule key", "test:\n  script: t\n  rules:\n    - iff: $A\n",
			nil, []string{`.gitlab-ci.yml:4:7: jobs:test:rules: unknown keyword "iff" (allowed: if, changes, exists, when, allow_failure, variables, start_in, interruptible, needs)`}},
		{"service unknown key", "test:\n  script: t\n  services:\n    - name: redis\n      port: 1\n",
			nil, []string{`.gitlab-ci.yml:5:7: jobs:test:services:0: unknown keyword "port" (allowed: name, entrypoint, pull_policy, docker, kubernetes, alias, command, variables)`}},
		{"image without name", "test:\n  script: t\n  image:\n    entrypoint: [\"\"]\n",
			nil, []string{`.gitlab-ci.yml:4:5: jobs:test:image: name is required`}},
		{"on_stop undefined", "test:\n  script: t\n  environment:\n    name: prod\n    on_stop: stop\n",
			nil, []string{`.gitlab-ci.yml:5:14: jobs:test:environment: on_stop job stop is not defined`}},
		{"invalid yaml", "foo: [\n",
			nil, []string{`.gitlab-ci.yml:2:1: invalid YAML: did not find expected node content while parsing a flow node at line 2 column 1`}},
		{"three documents", "spec: {}\n---\nb: 2\n---\nc: 3\n",
			nil, []string{`.gitlab-ci.yml:4:1: more than 2 YAML documents: a file holds at most a spec: header and the configuration`}},
		{"spec in the configuration", "spec:\n  inputs: {}\ntest:\n  script: t\n",
			nil, []string{`.gitlab-ci.yml:1:1: spec: must be a YAML document of its own: write spec:, then a line ---, then the configuration`}},
		{"unknown tag", "test:\n  script: !secret x\n",
			nil, []string{`.gitlab-ci.yml:2:11: unsupported YAML tag !secret`}},
		{"workflow when", "workflow:\n  rules:\n    - if: $A\n      when: manual\ntest:\n  script: t\n",
			nil, []string{`.gitlab-ci.yml:4:13: workflow:rules:when should be one of always, never, found "manual"`}},
		{"coverage", "test:\n  script: t\n  coverage: 'Coverage: \\d+'\n",
			nil, []string{`.gitlab-ci.yml:3:13: jobs:test:coverage should be a regular expression between slashes, like /Coverage: \d+%/`}},
		{"global and default image", "image: a\ndefault:\n  image: b\ntest:\n  script: t\n",
			nil, []string{`.gitlab-ci.yml:1:1: image is set both at the top level and in default; keep only default:image`}},
		{"types", "types: [a]\ntest:\n  script: t\n",
			nil, []string{`.gitlab-ci.yml:1:1: types was removed from GitLab CI; use stages`}},
		{"empty file", "",
			nil, []string{`.gitlab-ci.yml:1:1: configuration is empty`}},
		{"not a mapping", "- a\n- b\n",
			nil, []string{`.gitlab-ci.yml:1:1: configuration must be a mapping of keywords and jobs, found a list`}},
		{"several errors sorted", "b:\n  script: b\n  when: later\na:\n  stage: nope\n  script: a\n",
			nil, []string{
				`.gitlab-ci.yml:3:9: jobs:b:when should be one of on_success, on_failure, always, manual, delayed, found "later"`,
				`.gitlab-ci.yml:5:10: jobs:a: chosen stage nope does not exist; available stages are .pre, build, test, deploy, .post`,
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := compileErrors(t, tt.yml, Env{}, tt.extra...)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("errors:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

// TestNeedsOnRuleExcludedJob: a non-optional need on a job that rules
// keep out of the pipeline is an error for that pipeline.
func TestNeedsOnRuleExcludedJob(t *testing.T) {
	yml := "build:\n  stage: build\n  script: b\n  rules:\n    - if: $BUILD\ntest:\n  script: t\n  needs: [build]\n"
	got := compileErrors(t, yml, Env{})
	want := []string{`.gitlab-ci.yml:8:11: jobs:test:needs: test needs build, but build is not in the pipeline (its rules or only/except exclude it); use optional: true`}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	// With BUILD set the same file is fine.
	p := mustCompile(t, yml, Env{Variables: map[string]string{"BUILD": "1"}})
	if got := jobNames(p.Jobs); !reflect.DeepEqual(got, []string{"build", "test"}) {
		t.Errorf("jobs = %v", got)
	}
}

// An on_stop job without environment:action may get it from an include
// that did not load (deep-merged into the same job): not an error then;
// one that sets another action, or a file without unresolved includes, is.
func TestOnStopActionFromAnUnresolvedInclude(t *testing.T) {
	const jobs = "deploy:\n  script: d\n  environment: {name: review, on_stop: stop}\nstop:\n  script: s\n  rules: [{when: manual}]\n"
	const include = "include:\n  - project: group/templates\n    file: deploy.yml\n"
	const want = "jobs:deploy:environment: on_stop job stop needs to have environment with action: stop"
	unresolved := Env{Includes: NewDirResolver(nil, "")} // every include unresolved, as berth ci lint without a mirror
	if _, err := compileYAML(t, include+jobs, unresolved); err != nil {
		t.Errorf("with an unresolved include: %v", err)
	}
	if errs := compileErrors(t, jobs, Env{}); len(errs) != 1 || !strings.Contains(errs[0], want) {
		t.Errorf("without includes: %v, want %q", errs, want)
	}
	started := include + strings.Replace(jobs, "rules:", "environment: {name: review, action: start}\n  rules:", 1)
	if errs := compileErrors(t, started, unresolved); !strings.Contains(strings.Join(errs, "\n"), want) {
		t.Errorf("action: start with an unresolved include: %v, want %q", errs, want)
	}
}

// Documents as GitLab's loader reads them: empty ones (a trailing or
// leading ---, a comment alone) are none, and of two documents without a
// spec: header the first is the configuration and the second is ignored,
// with a warning (GitLab accepts such files silently).
func TestDocumentsWithoutHeader(t *testing.T) {
	for _, c := range []struct{ name, yml, jobs, warning string }{
		{"trailing ---", "a:\n  script: x\n---\n", "a", ""},
		{"comment between ---", "---\n# none\n---\na:\n  script: x\n", "a", ""},
		{"two documents", "a:\n  script: x\n---\nb:\n  script: y\n", "a",
			".gitlab-ci.yml:4:1: this second YAML document is ignored, as GitLab ignores it: only a file that starts with a spec: header holds two (the header, then the configuration)"},
	} {
		p, err := compileYAML(t, c.yml, Env{})
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		var msgs []string
		for _, w := range p.Warnings {
			msgs = append(msgs, w.String())
		}
		if got := strings.Join(jobNames(p.Jobs), ","); got != c.jobs || strings.Join(msgs, "\n") != c.warning {
			t.Errorf("%s: jobs %s, warnings %q; want %s and %q", c.name, got, msgs, c.jobs, c.warning)
		}
	}
	if errs := compileErrors(t, "a: 1\n---\nb:\n  script: y\n", Env{}); len(errs) != 1 || !strings.Contains(errs[0], "jobs:a config should be a mapping") {
		t.Errorf("a bad first document: %q, want its error (the second is not the configuration)", errs)
	}
}

// A $[[ ]] block in a file without a spec: header stays as written, as
// GitLab leaves it, with one warning per file.
func TestInterpolationWithoutHeaderIsText(t *testing.T) {
	p := mustCompile(t, "test:\n  script:\n    - echo $[[ inputs.x ]]\n    - echo $[[ inputs.y ]]\n", Env{})
	eq(t, "script", jobOf(t, p, "test").Script, []string{"echo $[[ inputs.x ]]", "echo $[[ inputs.y ]]"})
	var msgs []string
	for _, w := range p.Warnings {
		msgs = append(msgs, w.String())
	}
	want := ".gitlab-ci.yml:3:7: $[[ inputs.x ]] is left as written: interpolation needs a spec:inputs header in this file (spec:, then ---, then the configuration)"
	if len(msgs) != 1 || msgs[0] != want {
		t.Errorf("warnings %q, want [%q]", msgs, want)
	}
}

// TestQuotedJobNamesThatLookLikeValues: the same names quoted, or names
// that only begin like a number, are jobs, and so are symbols.
func TestQuotedJobNamesThatLookLikeValues(t *testing.T) {
	p := mustCompile(t, "\"true\":\n  script: x\n'1':\n  script: x\n1.5.2:\n  script: x\n1-build:\n  script: x\n\"null\":\n  script: x\n"+
		"\".5\":\n  script: x\n:deploy:\n  :script: x\n  :variables:\n    :V: v\n:\"a b\":\n  script: x\n\":quoted\":\n  script: x\n:.tmpl:\n  script: x\n", Env{})
	var names []string
	for _, j := range p.Jobs {
		names = append(names, j.Name)
	}
	// A plain :name key is the symbol's name, as GitLab symbolizes every
	// key; quoted, the colon is part of the string. ".5" quoted is a
	// hidden job, as is :.tmpl.
	if want := []string{"true", "1", "1.5.2", "1-build", "null", "deploy", "a b", ":quoted"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("jobs %q, want %q", names, want)
	}
	if v := varMap(p.Jobs[5].Variables)["V"]; v != "v" {
		t.Errorf("deploy's :V: variable is %q, want v", v)
	}
}
