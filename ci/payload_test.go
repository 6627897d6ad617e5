package ci

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRunnerPayload(t *testing.T) {
	p := mustCompile(t, `
test:
  image:
    name: golang:1.24
    docker: {platform: linux/amd64}
  services:
    - name: postgres:16
      alias: db
      variables: {POSTGRES_PASSWORD: pw}
  before_script: [go env]
  script: [go test ./...]
  after_script: [echo done]
  variables:
    RAW: {value: $X, expand: false}
  parallel: 2
  artifacts:
    name: report
    paths: [out/]
    exclude: [out/tmp]
    when: always
    expire_in: 1 week
    reports:
      junit: report.xml
      coverage_report: {coverage_format: cobertura, path: cov.xml}
  cache:
    key: deps
    paths: [.cache/]
    policy: pull
    fallback_keys: [deps-main]
  hooks:
    pre_get_sources_script: [echo pre]
`, Env{})
	j := jobOf(t, p, "test 2/2")
	pl, err := j.RunnerPayload(j.EffectiveTimeout(time.Hour, 0))
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(pl)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"steps":[{"name":"script","script":["go env","go test ./..."],"timeout":3600,"when":"on_success","allow_failure":false},` +
		`{"name":"after_script","script":["echo done"],"timeout":3600,"when":"always","allow_failure":true}],` +
		`"image":{"name":"golang:1.24","executor_opts":{"docker":{"platform":"linux/amd64"}}},` +
		`"services":[{"name":"postgres:16","alias":"db","variables":[{"key":"POSTGRES_PASSWORD","value":"pw","public":true,"file":false,"masked":false,"raw":false}]}],` +
		`"artifacts":[{"name":"report","untracked":false,"paths":["out/"],"exclude":["out/tmp"],"when":"always","artifact_type":"archive","artifact_format":"zip","expire_in":"1 week"},` +
		`{"name":"junit.xml","untracked":false,"paths":["report.xml"],"when":"always","artifact_type":"junit","artifact_format":"gzip","expire_in":"1 week"},` +
		`{"name":"cobertura-coverage.xml","untracked":false,"paths":["cov.xml"],"when":"always","artifact_type":"cobertura","artifact_format":"gzip","expire_in":"1 week"}],` +
		`"cache":[{"key":"deps","untracked":false,"policy":"pull","paths":[".cache/"],"when":"on_success","fallback_keys":["deps-main"]}],` +
		`"variables":[{"key":"CI_JOB_NAME_SLUG","value":"test-2-2","public":true,"file":false,"masked":false,"raw":false},` +
		`{"key":"CI_NODE_INDEX","value":"2","public":true,"file":false,"masked":false,"raw":false},` +
		`{"key":"CI_NODE_TOTAL","value":"2","public":true,"file":false,"masked":false,"raw":false},` +
		`{"key":"RAW","value":"$X","public":true,"file":false,"masked":false,"raw":true},` +
		`{"key":"BERTH_BEFORE_SCRIPT_LINES","value":"1","public":true,"file":false,"masked":false,"raw":true}],` +
		`"hooks":[{"name":"pre_get_sources_script","script":["echo pre"]}]}`
	if string(got) != want {
		t.Errorf("payload:\n got %s\nwant %s", got, want)
	}
}

func TestRunnerPayloadMinimal(t *testing.T) {
	p := mustCompile(t, "j:\n  script: make\n", Env{})
	pl, err := jobOf(t, p, "j").RunnerPayload(10 * time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(pl)
	want := `{"steps":[{"name":"script","script":["make"],"timeout":600,"when":"on_success","allow_failure":false}],"services":[],"artifacts":[],"cache":[],"variables":[{"key":"CI_JOB_NAME_SLUG","value":"j","public":true,"file":false,"masked":false,"raw":false},` +
		`{"key":"CI_NODE_TOTAL","value":"1","public":true,"file":false,"masked":false,"raw":false},` +
		`{"key":"BERTH_BEFORE_SCRIPT_LINES","value":"0","public":true,"file":false,"masked":false,"raw":true}]}`
	if string(got) != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
}

func TestRunnerPayloadUnresolvedCacheKey(t *testing.T) {
	p := mustCompile(t, "j:\n  script: make\n  cache:\n    key: {files: [go.sum]}\n", Env{})
	if _, err := jobOf(t, p, "j").RunnerPayload(time.Hour); !errors.Is(err, ErrUnresolvedCacheKey) {
		t.Fatalf("err = %v", err)
	}
}

func TestEffectiveTimeout(t *testing.T) {
	tests := []struct {
		job, project, runner, want time.Duration
	}{
		{0, time.Hour, 0, time.Hour},
		{2 * time.Hour, time.Hour, 0, 2 * time.Hour},
		{2 * time.Hour, time.Hour, 90 * time.Minute, 90 * time.Minute},
		{0, time.Hour, 3 * time.Hour, time.Hour},
		{0, 0, 0, 0},
	}
	for _, tt := range tests {
		j := &Job{Timeout: tt.job}
		if got := j.EffectiveTimeout(tt.project, tt.runner); got != tt.want {
			t.Errorf("EffectiveTimeout(job %v, project %v, runner %v) = %v, want %v", tt.job, tt.project, tt.runner, got, tt.want)
		}
	}
}

func TestJobJSONRoundTrip(t *testing.T) {
	p := mustCompile(t, "j:\n  script: make\n  timeout: 2h\n  when: delayed\n  start_in: 5m\n", Env{})
	b, err := json.Marshal(p.Jobs[0])
	if err != nil {
		t.Fatal(err)
	}
	var back Job
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	eq(t, "timeout", back.Timeout, 2*time.Hour)
	eq(t, "start_in", back.StartIn, 5*time.Minute)
	eq(t, "script", back.Script, []string{"make"})
}

// TestSeparateCaches: GitLab's protected/non_protected suffix goes on
// every key and fallback key, "-protected" only on a protected ref and
// not for an entry with unprotect: true.
func TestSeparateCaches(t *testing.T) {
	src := `j:
  script: make
  cache:
    - key: deps
      fallback_keys: [main-deps, any]
      paths: [vendor/]
    - key: shared
      unprotect: true
      paths: [tmp/]
`
	keys := func(protected bool) []string {
		t.Helper()
		p := mustCompile(t, src, Env{})
		j := jobOf(t, p, "j")
		pl, err := j.RunnerPayload(time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		pl.SeparateCaches(j, protected)
		var out []string
		for _, c := range pl.Cache {
			out = append(out, c.Key+" "+strings.Join(c.FallbackKeys, ","))
		}
		return out
	}
	if got, want := keys(false), []string{"deps-non_protected main-deps-non_protected,any-non_protected", "shared-non_protected "}; !slices.Equal(got, want) {
		t.Errorf("unprotected ref: %q, want %q", got, want)
	}
	if got, want := keys(true), []string{"deps-protected main-deps-protected,any-protected", "shared-non_protected "}; !slices.Equal(got, want) {
		t.Errorf("protected ref: %q, want %q", got, want)
	}
}

// TestRunnerPayloadMatrix: a parallel:matrix job tells a Berth runner its
// job's name before expansion, its matrix variables' names and where its
// before_script ends.
func TestRunnerPayloadMatrix(t *testing.T) {
	p := mustCompile(t, `
default:
  before_script: [make deps, make tools]
test:
  script: make test
  parallel:
    matrix:
      - GO: ["1.25", "1.26"]
        OS: [linux]
`, Env{})
	j := jobOf(t, p, "test: [1.26, linux]")
	pl, err := j.RunnerPayload(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, v := range pl.Variables {
		got[v.Key] = v.Value
	}
	for k, want := range map[string]string{"BERTH_MATRIX_GROUP": "test", "BERTH_MATRIX_VARIABLES": "GO,OS", "BERTH_BEFORE_SCRIPT_LINES": "2", "GO": "1.26"} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
	if len(pl.Steps) == 0 || len(pl.Steps[0].Script) != 3 {
		t.Errorf("script step %+v: want before_script and script, 3 lines", pl.Steps)
	}
}
