package ci

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
)

// mapResolver serves remote files from a map, counting fetches; errs
// answers chosen URLs with an error instead.
type mapResolver struct {
	remote  map[string]string
	errs    map[string]error
	fetches map[string]int
}

func (m *mapResolver) Remote(_ context.Context, url string, _ RemoteOptions) (*IncludedFile, error) {
	if m.fetches == nil {
		m.fetches = map[string]int{}
	}
	m.fetches[url]++
	if err, ok := m.errs[url]; ok {
		return nil, err
	}
	s, ok := m.remote[url]
	if !ok {
		return nil, IncludeErrorf("Remote file `%s` could not be fetched because of HTTP code `404` error!", url)
	}
	return &IncludedFile{Data: []byte(s), Location: url}, nil
}

func (m *mapResolver) Project(context.Context, string, string, string) (*IncludedFile, error) {
	return nil, IncludeErrorf("no projects")
}

func (m *mapResolver) Template(context.Context, string) (*IncludedFile, error) {
	return nil, IncludeErrorf("no templates")
}

func (m *mapResolver) Component(context.Context, ComponentRef) (*IncludedFile, error) {
	return nil, IncludeErrorf("no components")
}

func TestIncludeLimitCountsEveryKind(t *testing.T) {
	// a local file includes a remote one, which includes the next remote
	// one, and so on: the limit counts them all.
	r := &mapResolver{remote: map[string]string{}}
	for i := 0; i < 10; i++ {
		r.remote[fmt.Sprintf("https://x.test/%d.yml", i)] = fmt.Sprintf("include: https://x.test/%d.yml\nj%d:\n  script: [x]\n", i+1, i)
	}
	env := branch("main")
	env.Includes = r
	env.Limits = Limits{MaxIncludes: 5}
	_, err := compileYAML(t, "include: local.yml\n", env, "local.yml", "include: https://x.test/0.yml\n")
	if err == nil || !strings.Contains(err.Error(), "more than 5 included files") {
		t.Fatalf("err = %v, want the include limit", err)
	}
}

func TestResolverAnswers(t *testing.T) {
	boom := errors.New("disk on fire")
	r := &mapResolver{
		remote: map[string]string{"https://x.test/ok.yml": "ok:\n  script: [x]\n"},
		errs: map[string]error{
			"https://x.test/io.yml":      boom,
			"https://x.test/absent.yml":  fmt.Errorf("mirror: %w", ErrIncludeUnavailable),
			"https://x.test/denied.yml":  fmt.Errorf("wrapped: %w", IncludeErrorf("Remote file could not be fetched because the host is denied!")),
			"https://x.test/missing.yml": IncludeErrorf("gone"),
		},
	}
	env := branch("main")
	env.Includes = r

	// unavailable: compiled without it, its names are not reported
	p := mustCompile(t, "include:\n  - https://x.test/absent.yml\n  - https://x.test/ok.yml\n  - https://x.test/ok.yml\nj:\n  extends: .from-absent\n  script: [x]\n", env)
	if len(p.Jobs) != 2 || r.fetches["https://x.test/ok.yml"] != 1 {
		t.Fatalf("jobs %d, fetches %v", len(p.Jobs), r.fetches)
	}

	// an IncludeError is a configuration error at the include
	_, err := compileYAML(t, "include:\n  - remote: https://x.test/denied.yml\nj:\n  script: [x]\n", env)
	var list ErrorList
	if !errors.As(err, &list) || list[0].Pos.Line != 2 || !strings.Contains(list[0].Msg, "host is denied") {
		t.Fatalf("err = %v", err)
	}

	// anything else stops the compilation as an I/O error
	_, err = compileYAML(t, "include: https://x.test/io.yml\nj:\n  script: [x]\n", env)
	if !errors.Is(err, boom) || errors.As(err, &list) {
		t.Fatalf("err = %v, want the resolver's error", err)
	}

	// no resolver at all
	_, err = compileYAML(t, "include:\n  - project: g/p\n    file: a.yml\nj:\n  script: [x]\n", branch("main"))
	if err == nil || !strings.Contains(err.Error(), "no include resolver") {
		t.Fatalf("err = %v", err)
	}
}

func TestRemoteIntegrity(t *testing.T) {
	body := "ok:\n  script: [x]\n"
	sum := sha256.Sum256([]byte(body))
	good := "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
	bad := "sha256-" + base64.StdEncoding.EncodeToString(make([]byte, 32))
	env := branch("main")
	env.Includes = &mapResolver{remote: map[string]string{"https://x.test/a.yml": body}}
	mustCompile(t, "include:\n  - remote: https://x.test/a.yml\n    integrity: "+good+"\n", env)
	for _, tc := range []struct{ integrity, want string }{
		{bad, ".gitlab-ci.yml:2:13: Remote file `https://x.test/a.yml` does not match its integrity (its content is " + good + ")"},
		{"sha512-abc", ".gitlab-ci.yml:3:16: include:integrity should be sha256- followed by the base64 of the file's SHA-256 digest"},
	} {
		_, err := compileYAML(t, "include:\n  - remote: https://x.test/a.yml\n    integrity: "+tc.integrity+"\n", env)
		if err == nil || err.Error() != tc.want {
			t.Errorf("integrity %s: err = %v, want %s", tc.integrity, err, tc.want)
		}
	}
}

func TestIncludeEntryErrors(t *testing.T) {
	env := branch("main")
	env.Includes = NewDirResolver(fstest.MapFS{}, "m")
	for _, tc := range []struct{ yml, want string }{
		{"include:\n  - remote: https://x.test/a.yml\n    local: a.yml\n", "Each include must use only one of"},
		{"include:\n  - file: a.yml\n", "does not have a valid subkey for include"},
		{"include:\n  - local: a.yml\n    ref: main\n", "include:ref can only be used with include:project"},
		{"include:\n  - remote: https://x.test/a.yml\n    cache: 10 seconds\n", "include:cache must be at least 1 minute"},
		{"include:\n  - remote: ftp://x.test/a.yml\n", "does not have a valid address"},
		{"include:\n  - remote: https://x.test/a.json\n", "does not have YAML extension"},
		{"include:\n  - template: ../../etc/passwd.gitlab-ci.yml\n", "is not a valid location"},
		{"include:\n  - template: Go.yml\n", "is not a valid location"},
		{"include:\n  - component: gitlab.test/name@1.0\n", "want HOST/GROUP/PROJECT/NAME@VERSION"},
		{"include:\n  - component: gitlab.test/g/p/name\n", "needs a version"},
		{"include:\n  - project: g/p\n", "include:project needs file"},
		{"include:\n  - artifact: a.yml\n    job: gen\n", "only for child pipelines"},
	} {
		_, err := compileYAML(t, tc.yml+"j:\n  script: [x]\n", env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want %q", tc.yml, err, tc.want)
		}
	}
}

func TestResolveComponentVersion(t *testing.T) {
	tags := []string{"0.9.0", "1.0.0", "1.2.0", "1.2.9", "1.10.1", "v1.11.0-rc1", "2.0.0-rc1", "main-build", "v1.3.0"}
	for _, tc := range []struct{ v, want string }{
		{"~latest", "1.10.1"},
		{"1", "1.10.1"},
		{"1.2", "1.2.9"},
		{"1.3", "v1.3.0"},
		{"0", "0.9.0"},
		{"3", ""},
		{"1.2.0", ""}, // a full version is a tag or ref, looked up as written
		{"main", ""},
	} {
		got, ok := ResolveComponentVersion(tc.v, tags)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: got %q %v, want %q", tc.v, got, ok, tc.want)
		}
	}
}

func TestInterpolationFunctions(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "''"},
		{"a b", `a\ b`},
		{"it's $HOME", `it\'s\ \$HOME`},
		{"x\ny", "x'\n'y"},
		{"ok-1.2_3,+:/@", "ok-1.2_3,+:/@"},
		{"é", `\é`},
	} {
		if got := shellEscape(tc.in); got != tc.want {
			t.Errorf("shellEscape(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	for _, tc := range []struct {
		in     string
		off, n int
		want   string
	}{{"hello", 1, 3, "ell"}, {"hello", 3, 10, "lo"}, {"hello", 5, 1, ""}, {"hello", 9, 1, ""}, {"héllo", 0, 2, "hé"}} {
		if got := truncateRunes(tc.in, tc.off, tc.n); got != tc.want {
			t.Errorf("truncate(%q, %d, %d) = %q, want %q", tc.in, tc.off, tc.n, got, tc.want)
		}
	}
	vars := map[string]string{"A": "1", "B": "two"}
	if got := expandExisting("$A ${B} %A% $C ${D} $$A", vars); got != "1 two 1 $C ${D} $1" {
		t.Errorf("expandExisting = %q", got)
	}
}

func TestInterpolationBlockLimit(t *testing.T) {
	var b strings.Builder
	b.WriteString("spec:\n  inputs:\n    a:\n      default: x\n---\nj:\n  script:\n")
	for i := 0; i <= maxInterpolationBlocks; i++ {
		fmt.Fprintf(&b, "    - $[[ inputs.a | truncate(0,%d) ]]\n", i)
	}
	_, err := compileYAML(t, b.String(), branch("main"))
	if err == nil || !strings.Contains(err.Error(), "too many interpolation blocks") || strings.Count(err.Error(), "\n") != 0 {
		t.Fatalf("err = %v, want one too-many-blocks error", err)
	}
}

func TestPipelineInputs(t *testing.T) {
	yml := "spec:\n  inputs:\n    n:\n      type: number\n    tags:\n      type: array\n      default: []\n---\nj:\n  parallel: $[[ inputs.n ]]\n  tags: $[[ inputs.tags ]]\n  script: [x]\n"
	env := branch("main")
	env.Inputs = map[string]any{"n": 2, "tags": []any{"a", "b"}}
	p := mustCompile(t, yml, env)
	if len(p.Jobs) != 2 || strings.Join(p.Jobs[0].Tags, ",") != "a,b" {
		t.Fatalf("jobs %d tags %v", len(p.Jobs), p.Jobs[0].Tags)
	}
	env.Inputs = map[string]any{"n": "two"}
	if _, err := compileYAML(t, yml, env); err == nil || !strings.Contains(err.Error(), "pipeline inputs: `n` input: provided value is not a number") {
		t.Fatalf("err = %v", err)
	}
	env.Inputs = map[string]any{"n": 1, "x": "y"}
	if _, err := compileYAML(t, yml, env); err == nil || !strings.Contains(err.Error(), "unknown input arguments: x") {
		t.Fatalf("err = %v", err)
	}
	env.Inputs = map[string]any{"n": 1}
	if _, err := compileYAML(t, "j:\n  script: [x]\n", env); err == nil || !strings.Contains(err.Error(), "Given inputs not defined") {
		t.Fatalf("err = %v", err)
	}
}

func TestDirResolverLayout(t *testing.T) {
	m := fstest.MapFS{
		"remote/x.test:8443/a/b.yml":                  {Data: []byte("r:\n  script: [r]\n")},
		"templates/Jobs/T.gitlab-ci.yml":              {Data: []byte("t:\n  script: [t]\n")},
		"projects/g/p/f.yml":                          {Data: []byte("include: local.yml\n")},
		"projects/g/p/local.yml":                      {Data: []byte("p:\n  script: [p]\n")},
		"projects/g/c@2.0.0/templates/k/template.yml": {Data: []byte("k:\n  script: [k]\n")},
	}
	d := NewDirResolver(m, "mirror")
	env := branch("main")
	env.Includes = d
	p := mustCompile(t, "include:\n  - https://x.test:8443/a/b.yml?x=1.yml\n  - template: Jobs/T.gitlab-ci.yml\n  - project: g/p\n    ref: v9\n    file: f.yml\n  - component: h.test/g/c/k@~latest\n", env)
	var names []string
	for _, j := range p.Jobs {
		names = append(names, j.Name+"@"+j.Pos.File)
	}
	want := "r@mirror/remote/x.test:8443/a/b.yml t@mirror/templates/Jobs/T.gitlab-ci.yml p@mirror/projects/g/p/local.yml k@mirror/projects/g/c@2.0.0/templates/k/template.yml"
	if strings.Join(names, " ") != want {
		t.Fatalf("jobs %v\nwant %s", names, want)
	}
	if u := d.Unresolved(); len(u) != 0 {
		t.Fatalf("unresolved %v", u)
	}
	var _ fs.FS = m
}

func TestInputRulesErrors(t *testing.T) {
	var opts []string
	for i := range 51 {
		opts = append(opts, fmt.Sprintf("o%d", i))
	}
	fiftyOneOptions := strings.Join(opts, ", ")
	const spec = `spec:
  inputs:
    env:
      default: dev
    tier:
      rules:
        - if: $[[ inputs.env ]] == "dev"
          options: [small]
          default: small
        - options: [large]
---
job-$[[ inputs.tier ]]:
  script: x
`
	for _, tt := range []struct{ inputs, file, want string }{
		{"{env: dev, tier: large}", spec, "`tier` input: `large` cannot be used because it is not in the list of allowed options"},
		{"{env: prod, tier: small}", spec, "`tier` input: `small` cannot be used because it is not in the list of allowed options"},
		{"{}", "spec:\n  inputs:\n    a:\n      rules: [{if: '$[[ inputs.b ]] == \"x\"', default: y}]\n    b:\n      rules: [{if: '$[[ inputs.a ]] == \"x\"', default: y}]\n---\nj:\n  script: x\n", "rules read inputs in a cycle"},
		{"{}", "spec:\n  inputs:\n    a:\n      rules: [{if: '$[[ inputs.nope ]] == \"x\"', default: y}]\n---\nj:\n  script: x\n", "rules read unknown input nope"},
		{"{}", "spec:\n  inputs:\n    a:\n      default: x\n      rules: [{default: y}]\n---\nj:\n  script: x\n", "rules cannot be used with default or options"},
		{"{}", "spec:\n  inputs:\n    a:\n      rules: [{if: '$[[ inputs.a ]] ==', default: y}]\n---\nj:\n  script: x\n", "spec:inputs:a:rules:if:"},
		{"{}", "spec:\n  inputs:\n    a:\n      default: o1\n      options: [" + fiftyOneOptions + "]\n---\nj:\n  script: x\n", "spec:inputs:a config cannot define more than 50 options"},
		{"{}", "spec:\n  inputs:\n    a:\n      rules: [{options: [" + fiftyOneOptions + "], default: o1}]\n---\nj:\n  script: x\n", "spec:inputs:a:rules config cannot define more than 50 options"},
	} {
		errs := compileErrors(t, "include:\n  - local: f.yml\n    inputs: "+tt.inputs+"\n", branch("main"), "f.yml", tt.file)
		if !strings.Contains(strings.Join(errs, "\n"), tt.want) {
			t.Errorf("inputs %s: errors %q, want %q", tt.inputs, errs, tt.want)
		}
	}
	noFallback := strings.Replace(spec, "        - options: [large]\n", "", 1)
	p := mustCompile(t, "include:\n  - local: f.yml\n    inputs: {env: prod}\n", branch("main"), "f.yml", noFallback)
	if len(p.Jobs) != 1 || p.Jobs[0].Name != "job-" {
		t.Errorf("no rule default: jobs %q, want job- (the input is empty)", jobNames(p.Jobs))
	}
}

// yes/on/no/off given to (or defaulting) a boolean input are GitLab's true
// and false (its YAML parser reads them so): they interpolate as such,
// whole values and inside strings.
func TestYAML11BooleanInputs(t *testing.T) {
	tmpl := "spec:\n  inputs:\n    af:\n      type: boolean\n    dflt:\n      type: boolean\n      default: off\n---\nj:\n  allow_failure: $[[ inputs.af ]]\n  script: [\"echo af=$[[ inputs.af ]] d=$[[ inputs.dflt ]]\"]\n"
	p := mustCompile(t, "include:\n  - local: t.yml\n    inputs:\n      af: yes\n", Env{}, "t.yml", tmpl)
	j := jobOf(t, p, "j")
	eq(t, "script", j.Script, []string{"echo af=true d=false"})
	eq(t, "allow_failure", j.AllowFailure, true)
}

// A boolean input compares with the literals true and false in input
// rules (GitLab 18.7's documented example); a string "true" does not.
func TestBooleanInputRules(t *testing.T) {
	tmpl := "spec:\n  inputs:\n    publish:\n      type: boolean\n      default: true\n    word:\n      default: 'true'\n    stage:\n      rules:\n        - if: $[[ inputs.publish ]] == true && $[[ inputs.word ]] == true\n          default: never\n        - if: $[[ inputs.publish ]] == true\n          default: deploy\n        - if: $[[ inputs.publish ]] == false\n          default: test\n---\nj:\n  stage: $[[ inputs.stage ]]\n  script: [x]\n"
	for _, tc := range []struct{ given, want string }{{"", "deploy"}, {"      publish: false\n", "test"}, {"      publish: no\n", "test"}} {
		inc := "include:\n  - local: t.yml\n"
		if tc.given != "" {
			inc += "    inputs:\n" + tc.given
		}
		p := mustCompile(t, inc, Env{}, "t.yml", tmpl)
		eq(t, "stage with "+tc.given, jobOf(t, p, "j").Stage, tc.want)
	}
}

// spec:component exposes the component context GitLab gives a component's
// files: name, sha, version (the release the address resolved to, empty
// for a commit) and reference (as written); only what it lists, and only
// in a component (and the local files it includes).
func TestComponentContext(t *testing.T) {
	const sha = "0123456789abcdef0123456789abcdef01234567"
	tmpl := "spec:\n  component: [name, version, reference, sha]\n---\ninclude: nested.yml\n$[[ component.name ]]-job:\n  script: [\"echo $[[ component.version ]] $[[ component.reference ]] $[[ component.sha | truncate(0,7) ]]\"]\n"
	nested := "spec:\n  component: [name]\n---\nnested-$[[ component.name ]]:\n  script: [x]\n"
	m := fstest.MapFS{
		"projects/g/c@1.2.0/templates/build.yml":       {Data: []byte(tmpl)},
		"projects/g/c@1.2.0/nested.yml":                {Data: []byte(nested)},
		"projects/g/c@" + sha + "/templates/build.yml": {Data: []byte(tmpl)},
		"projects/g/c@" + sha + "/nested.yml":          {Data: []byte(nested)},
		"projects/g/c@1.2.0/templates/undeclared.yml":  {Data: []byte("spec:\n  component: [name]\n---\nj:\n  script: [\"echo $[[ component.sha ]]\"]\n")},
		"projects/g/p/plain.yml":                       {Data: []byte("spec:\n  component: [name]\n---\nj:\n  script: [\"echo $[[ component.name ]]\"]\n")},
		"projects/g/c@1.2.0/templates/bad.yml":         {Data: []byte("spec:\n  component: [name, colour]\n---\nj:\n  script: [x]\n")},
	}
	env := branch("main")
	env.Includes = NewDirResolver(m, "mirror")
	for _, tc := range []struct{ version, script string }{
		{"1.2", "echo 1.2.0 1.2 "},
		{"~latest", "echo 1.2.0 ~latest "},
		{sha, "echo  " + sha + " 0123456"},
	} {
		p := mustCompile(t, "include:\n  - component: h.test/g/c/build@"+tc.version+"\n", env)
		eq(t, "script at "+tc.version, jobOf(t, p, "build-job").Script, []string{tc.script})
		jobOf(t, p, "nested-build") // a local include of the component has its context
	}
	for file, want := range map[string]string{
		"- component: h.test/g/c/undeclared@1.2.0": "unknown interpolation provided: `sha` in `component.sha`",
		"- project: g/p\n    file: plain.yml":      "unknown interpolation provided: `name` in `component.name`",
		"- component: h.test/g/c/bad@1.2.0":        `spec:component: unknown value "colour"`,
	} {
		errs := compileErrors(t, "include:\n  "+file+"\n", env)
		if !strings.Contains(strings.Join(errs, "\n"), want) {
			t.Errorf("%s: errors %q, want %q", file, errs, want)
		}
	}
}

// A rule's default: null (GitLab 18.9) makes the input one the user must
// enter when the rule matches.
func TestInputRuleDefaultNull(t *testing.T) {
	tmpl := "spec:\n  inputs:\n    kind:\n      options: [standard, custom]\n      default: standard\n    config:\n      rules:\n        - if: $[[ inputs.kind ]] == 'custom'\n          default: null\n---\nj:\n  script: [\"echo config=$[[ inputs.config ]]\"]\n"
	p := mustCompile(t, "include:\n  - local: t.yml\n    inputs: {kind: custom, config: abc}\n", Env{}, "t.yml", tmpl)
	eq(t, "given", jobOf(t, p, "j").Script, []string{"echo config=abc"})
	p = mustCompile(t, "include:\n  - local: t.yml\n", Env{}, "t.yml", tmpl)
	eq(t, "no rule matched: optional and empty", jobOf(t, p, "j").Script, []string{"echo config="})
	errs := compileErrors(t, "include:\n  - local: t.yml\n    inputs: {kind: custom}\n", Env{}, "t.yml", tmpl)
	if !strings.Contains(strings.Join(errs, "\n"), "`config` input: required value has not been provided") {
		t.Errorf("errors %q", errs)
	}
}

// default: null (or default: with nothing) makes an input optional without
// a value, whatever its type, as GNOME's templates and GitLab's documented
// "entirely optional inputs" use it: within text it is "", as a whole
// value null (a key set to it is as if unset); a given value replaces it.
func TestInputDefaultNull(t *testing.T) {
	tmpl := "spec:\n  inputs:\n    extra-options:\n      default: null\n    after:\n      type: array\n      default:\n    retries:\n      type: number\n      default: null\n---\n" +
		"stages: [build, test]\nprep:\n  stage: build\n  script: [p]\n" +
		"build:\n  stage: test\n  script: [\"meson setup _build $[[ inputs.extra-options ]]\"]\n  needs: $[[ inputs.after ]]\n  retry: $[[ inputs.retries ]]\n"
	p := mustCompile(t, "include:\n  - local: t.yml\n", Env{}, "t.yml", tmpl)
	b := jobOf(t, p, "build")
	eq(t, "script", b.Script, []string{"meson setup _build "})
	if b.Scheduling == ScheduleDAG || len(b.Needs) != 0 || b.Retry.Max != 0 {
		t.Errorf("null as a whole value: scheduling %s, needs %+v, retry %+v; want stage order, none", b.Scheduling, b.Needs, b.Retry)
	}
	p = mustCompile(t, "include:\n  - local: t.yml\n    inputs: {extra-options: -Dx=1, after: [prep], retries: 2}\n", Env{}, "t.yml", tmpl)
	b = jobOf(t, p, "build")
	eq(t, "given script", b.Script, []string{"meson setup _build -Dx=1"})
	if len(b.Needs) != 1 || b.Needs[0].Job != "prep" || b.Retry.Max != 2 {
		t.Errorf("given values: needs %+v, retry %+v", b.Needs, b.Retry)
	}
}

// TestNumberInputsInTextAsRubyPrintsThem: a number input inside a longer
// string is Ruby's to_s of what Psych read (an unquoted 3.10 is 3.1, 1e20
// written as 1.0e+20 is printed so).
func TestNumberInputsInTextAsRubyPrintsThem(t *testing.T) {
	yml := "spec:\n  inputs:\n    v:\n      type: number\n      default: 3.10\n    big:\n      type: number\n      default: 1.0e+20\n---\nj:\n  script: ['echo v$[[ inputs.v ]] $[[ inputs.big ]]']\n"
	p := mustCompile(t, yml, branch("main"))
	if got := p.Jobs[0].Script[0]; got != "echo v3.1 1.0e+20" {
		t.Errorf("script %q", got)
	}
}
