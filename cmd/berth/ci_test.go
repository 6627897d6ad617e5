package main

import (
	"fmt"
	"os/exec"

	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/internal/testenv"
)

func writeFiles(t *testing.T, kv ...string) string {
	t.Helper()
	dir := t.TempDir()
	for i := 0; i+1 < len(kv); i += 2 {
		p := filepath.Join(dir, filepath.FromSlash(kv[i]))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(kv[i+1]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func runLint(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCmd()
	var out, stderr bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&stderr)
	cmd.SetArgs(append([]string{"ci", "lint"}, args...))
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

const lintYAML = `include: ci/deploy.yml
build:
  stage: build
  script: make
  cache:
    key: {files: [go.sum]}
test:
  script: make test
  needs: [build]
  rules:
    - if: $CI_COMMIT_BRANCH == "main" || $FORCE == "1"
    - exists: [Dockerfile]
      when: manual
`

const deployYAML = `deploy:
  stage: deploy
  script: ./deploy
  rules:
    - if: $CI_COMMIT_TAG
`

func TestCILintValid(t *testing.T) {
	dir := writeFiles(t, ".gitlab-ci.yml", lintYAML, "ci/deploy.yml", deployYAML, "go.sum", "x")
	out, err := runLint(t, filepath.Join(dir, ".gitlab-ci.yml"))
	if err != nil {
		t.Fatalf("lint: %v\n%s", err, out)
	}
	for _, want := range []string{
		"is valid\npipeline for main: created\nstages: .pre, build, test, deploy, .post\n",
		"build   build   on_success  -        no rules\n",
		"test    test    on_success  [build]  rule 1 matched\n",
		"deploy  deploy  never       -        no rule matched\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// --ref, --tag and --var change the rules outcome.
	out, err = runLint(t, "--root", dir, "--ref", "v1.0", "--tag", "--var", "FORCE=1", filepath.Join(dir, ".gitlab-ci.yml"))
	if err != nil {
		t.Fatalf("lint: %v\n%s", err, out)
	}
	if !strings.Contains(out, "test    test    on_success  [build]  rule 1 matched") || !strings.Contains(out, "deploy  deploy  on_success  -        rule 1 matched") {
		t.Errorf("tag output:\n%s", out)
	}
}

func TestCILintJSON(t *testing.T) {
	dir := writeFiles(t, ".gitlab-ci.yml", lintYAML, "ci/deploy.yml", deployYAML, "go.sum", "x", "Dockerfile", "FROM x")
	out, err := runLint(t, "--json", "--ref", "feature", filepath.Join(dir, ".gitlab-ci.yml"))
	if err != nil {
		t.Fatalf("lint: %v\n%s", err, out)
	}
	var res struct {
		Valid    bool
		Errors   []lintError
		Pipeline struct {
			Created bool
			Jobs    []struct {
				Name  string
				When  string
				Cache []struct{ Key string }
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !res.Valid || !res.Pipeline.Created || len(res.Pipeline.Jobs) != 2 {
		t.Fatalf("result: %+v", res)
	}
	// The feature branch reaches the exists rule: Dockerfile is there.
	if j := res.Pipeline.Jobs[1]; j.Name != "test" || j.When != "manual" {
		t.Errorf("test job: %+v", j)
	}
	// GitLab's key: the SHA-1 of go.sum's blob id, c1b0730e…
	// (printf x | git hash-object --stdin).
	if k := res.Pipeline.Jobs[0].Cache[0].Key; k != "a62431cba0b37e2d007cbe5eeec0bce7b8ec9c76" {
		t.Errorf("cache key:files key = %q, want the digest of go.sum's blob id", k)
	}
}

func TestCILintErrors(t *testing.T) {
	dir := writeFiles(t, ".gitlab-ci.yml", "include: ci/x.yml\nbuild:\n  stage: nope\n  script: make\n",
		"ci/x.yml", "lint:\n  script: [lint]\n  when: later\n")
	out, err := runLint(t, filepath.Join(dir, ".gitlab-ci.yml"))
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("err = %v, want exit code 1", err)
	}
	want := filepath.Join(dir, ".gitlab-ci.yml") + ":3:10: jobs:build: chosen stage nope does not exist; available stages are .pre, build, test, deploy, .post\n" +
		filepath.Join(dir, "ci/x.yml") + `:3:9: jobs:lint:when should be one of on_success, on_failure, always, manual, delayed, found "later"` + "\n"
	if out != want {
		t.Errorf("output:\n%s\nwant:\n%s", out, want)
	}

	out, _ = runLint(t, "--json", filepath.Join(dir, ".gitlab-ci.yml"))
	var res lintResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.Valid || len(res.Errors) != 2 || res.Errors[1].Line != 3 || res.Errors[1].Col != 9 || res.Pipeline != nil {
		t.Errorf("json result: %+v", res)
	}
}

func TestCILintDefaultFileAndBadVar(t *testing.T) {
	dir := writeFiles(t, ".gitlab-ci.yml", "j:\n  script: x\n")
	wd, _ := os.Getwd()
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	defer os.Chdir(wd)
	out, err := runLint(t)
	if err != nil || !strings.HasPrefix(out, ".gitlab-ci.yml is valid\n") {
		t.Fatalf("default file: %v\n%s", err, out)
	}
	if _, err := runLint(t, "--var", "NOEQUALS"); err == nil || !strings.Contains(err.Error(), "want KEY=VALUE") {
		t.Errorf("bad --var: %v", err)
	}
	if _, err := runLint(t, "missing.yml"); err == nil {
		t.Error("missing file accepted")
	}
}

func TestCILintShowsBridges(t *testing.T) {
	dir := writeFiles(t, ".gitlab-ci.yml", `
gen:
  stage: build
  script: [x]
child:
  needs: [gen]
  trigger:
    include: [{local: child.yml}, {artifact: out.yml, job: gen}]
    strategy: depend
deploy:
  stage: deploy
  trigger: {project: group/deployer, branch: prod}
`, "child.yml", "c:\n  script: [x]\n")
	out, err := runLint(t, filepath.Join(dir, ".gitlab-ci.yml"), "--root", dir)
	if err != nil {
		t.Fatalf("lint: %v\n%s", err, out)
	}
	for _, want := range []string{
		"child [→ child pipeline (child.yml, artifact out.yml of gen), strategy depend]",
		"deploy [→ project group/deployer@prod]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("lint output lacks %q:\n%s", want, out)
		}
	}
}

func TestLintIncludeDir(t *testing.T) {
	repo := writeFiles(t, ".gitlab-ci.yml", `include:
  - project: group/shared
    ref: v1
    file: ci/build.yml
  - remote: https://ci.example.com/test.yml
  - template: Jobs/SAST.gitlab-ci.yml
  - component: gitlab.example.com/org/comp/deploy@~latest
    inputs:
      env: prod
  - remote: https://missing.example.com/x.yml
  - remote: https://missing.example.com/x.yml
    cache: true
after:
  stage: .post
  extends: .defined-in-missing
  script: [done]
`)
	mirror := writeFiles(t,
		"projects/group/shared@v1/ci/build.yml", "include: common.yml\nbuild:\n  extends: .common\n  script: [make]\n",
		"projects/group/shared@v1/common.yml", ".common:\n  stage: build\n",
		"remote/ci.example.com/test.yml", "test:\n  script: [test]\n",
		"templates/Jobs/SAST.gitlab-ci.yml", "sast:\n  stage: test\n  script: [sast]\n",
		"projects/org/comp@1.0.0/templates/deploy.yml", "spec:\n  inputs:\n    env:\n---\ndeploy-$[[ inputs.env ]]:\n  stage: deploy\n  script: [old]\n",
		"projects/org/comp@1.1.0/templates/deploy.yml", "spec:\n  inputs:\n    env:\n---\ndeploy-$[[ inputs.env ]]:\n  stage: deploy\n  script: [new]\n",
	)
	out, err := runLint(t, filepath.Join(repo, ".gitlab-ci.yml"), "--include-dir", mirror)
	if err != nil {
		t.Fatalf("lint: %v\n%s", err, out)
	}
	for _, want := range []string{"build  ", "test  ", "sast", "deploy-prod", "after",
		"unresolved include:remote https://missing.example.com/x.yml: not checked; put it at " + mirror + "/remote/missing.example.com/x.yml"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "unresolved include"); n != 1 {
		t.Errorf("%d unresolved lines, want 1:\n%s", n, out)
	}

	out, err = runLint(t, filepath.Join(repo, ".gitlab-ci.yml"), "--include-dir", mirror, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var res lintResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if !res.Valid || len(res.Unresolved) != 1 || res.Unresolved[0].Kind != "remote" || res.Pipeline.Job("deploy-prod").Script[0] != "new" {
		t.Fatalf("result %+v", res)
	}

	// without a mirror every such include is unresolved, and the file is
	// still valid
	out, err = runLint(t, filepath.Join(repo, ".gitlab-ci.yml"))
	if err != nil || strings.Count(out, "unresolved include") != 5 || !strings.Contains(out, "no include directory was given") {
		t.Fatalf("lint without a mirror: %v\n%s", err, out)
	}

	// an error inside a mirror file points at the mirror file
	bad := writeFiles(t, "remote/ci.example.com/test.yml", "test:\n  script: [test]\n  when: sometimes\n")
	out, err = runLint(t, filepath.Join(repo, ".gitlab-ci.yml"), "--include-dir", bad)
	var ee *exitError
	if !errors.As(err, &ee) || !strings.Contains(out, bad+"/remote/ci.example.com/test.yml:3:9: jobs:test:when") {
		t.Fatalf("err %v\n%s", err, out)
	}
}

// rules:exists with project: another project's files come from the mirror,
// the linted project's own from the work tree.
func TestLintRulesExistsInProject(t *testing.T) {
	rule := func(name, project, file string) string {
		return name + ":\n  script: [x]\n  rules:\n    - exists:\n        paths: [" + file + "]\n        project: " + project + "\n        ref: main\n"
	}
	repo := writeFiles(t, ".gitlab-ci.yml",
		rule("theirs", "group/other", "Dockerfile")+rule("absent", "group/other", "missing")+
			rule("unknown", "group/unknown", "Dockerfile")+rule("own", "$CI_PROJECT_PATH", "go.mod"),
		"go.mod", "module x\n")
	mirror := writeFiles(t, "projects/group/other@main/Dockerfile", "FROM x\n")
	out, err := runLint(t, filepath.Join(repo, ".gitlab-ci.yml"), "--include-dir", mirror, "--json")
	if err != nil {
		t.Fatalf("lint: %v\n%s", err, out)
	}
	var res lintResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"theirs": true, "absent": false, "unknown": false, "own": true} {
		if got := res.Pipeline.Job(name) != nil; got != want {
			t.Errorf("job %s in the pipeline: %v, want %v", name, got, want)
		}
	}
	if len(res.Unresolved) != 1 || !strings.Contains(res.Unresolved[0].Include, "group/unknown@main") || !strings.Contains(res.Unresolved[0].Hint, "projects/group/unknown") {
		t.Errorf("unresolved %+v, want group/unknown's directory", res.Unresolved)
	}
}

func TestLintInputs(t *testing.T) {
	repo := writeFiles(t, ".gitlab-ci.yml", "spec:\n  inputs:\n    n:\n      type: number\n    env:\n      options: [a, b]\n---\nj-$[[ inputs.env ]]:\n  parallel: $[[ inputs.n ]]\n  script: [x]\n")
	out, err := runLint(t, filepath.Join(repo, ".gitlab-ci.yml"), "--input", "n=2", "--input", "env=b")
	if err != nil || !strings.Contains(out, "j-b 2/2") {
		t.Fatalf("lint: %v\n%s", err, out)
	}
	out, err = runLint(t, filepath.Join(repo, ".gitlab-ci.yml"), "--input", "n=x", "--input", "env=c")
	if err == nil || !strings.Contains(out, "`n` input: provided value is not a number") || !strings.Contains(out, "`c` cannot be used") {
		t.Fatalf("lint: %v\n%s", err, out)
	}
}

// The project and server variables rules and includes read are set in
// lint: from the repository's origin remote, or from flags.
func TestLintProjectVariables(t *testing.T) {
	dir := writeFiles(t,
		".gitlab-ci.yml", `include:
  - local: tags.yml
    rules: [{if: $CI_PROJECT_PATH == "group/sub/app"}]
on-gitlab-com:
  script: x
  rules: [{if: $CI_SERVER_HOST == "gitlab.com" && $CI_PROJECT_NAMESPACE == "group/sub" && $CI_SERVER_FQDN == "gitlab.com"}]
elsewhere:
  script: x
  rules: [{if: $CI_SERVER_HOST != "gitlab.com"}]
`,
		"tags.yml", "from-include:\n  script: x\n",
		".git/config", "[core]\n\tbare = false\n[remote \"origin\"]\n\turl = git@gitlab.com:group/sub/app.git\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n")
	out, err := runLint(t, "--json", filepath.Join(dir, ".gitlab-ci.yml"))
	if err != nil {
		t.Fatalf("lint: %v\n%s", err, out)
	}
	var res lintResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if names := jobNamesOf(res); names != "from-include,on-gitlab-com" {
		t.Errorf("jobs from origin git@gitlab.com:group/sub/app.git = %s, want from-include,on-gitlab-com", names)
	}
	out, err = runLint(t, "--json", "--server-url", "https://git.example.org:8443", "--project", "other/app", filepath.Join(dir, ".gitlab-ci.yml"))
	if err != nil {
		t.Fatalf("lint: %v\n%s", err, out)
	}
	res = lintResult{}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if names := jobNamesOf(res); names != "elsewhere" {
		t.Errorf("jobs with --server-url/--project = %s, want elsewhere", names)
	}
	if _, err := runLint(t, "--server-url", "ftp://x", filepath.Join(dir, ".gitlab-ci.yml")); err == nil || !strings.Contains(err.Error(), "--server-url") {
		t.Errorf("bad --server-url: %v", err)
	}
}

func jobNamesOf(res lintResult) string {
	if res.Pipeline == nil {
		return "(invalid)"
	}
	var n []string
	for _, j := range res.Pipeline.Jobs {
		n = append(n, j.Name)
	}
	return strings.Join(n, ",")
}

// TestLintGitRepository: in a git work tree lint reads HEAD for the
// CI_COMMIT_* variables, compares HEAD with compare_to for rules:changes,
// reads a component of the project itself at $CI_COMMIT_SHA from the
// root's templates/, and a merge request pipeline has CI_MERGE_REQUEST_*
// and no CI_COMMIT_BRANCH.
func TestLintGitRepository(t *testing.T) {
	testenv.LookPath(t, "git")
	dir := writeFiles(t,
		".gitlab-ci.yml", `include:
  - component: $CI_SERVER_FQDN/$CI_PROJECT_PATH/greet@$CI_COMMIT_SHA
    inputs: {who: lint}
src-changed:
  script: x
  rules:
    - changes: {paths: [src/**], compare_to: refs/heads/main}
release-commit:
  script: x
  rules: [{if: $CI_COMMIT_TITLE =~ /^release/ && $CI_COMMIT_SHA != "0000000000000000000000000000000000000000"}]
mr-only:
  script: x
  rules: [{if: $CI_MERGE_REQUEST_IID && $CI_MERGE_REQUEST_TARGET_BRANCH_NAME == "main" && $CI_COMMIT_BRANCH == null}]
branch-only:
  script: x
  rules: [{if: $CI_COMMIT_BRANCH}]
readme-changed-in-mr:
  script: x
  rules: [{if: $CI_MERGE_REQUEST_IID, changes: [README]}]
`,
		"templates/greet.yml", "spec:\n  inputs:\n    who:\n---\ngreet-$[[ inputs.who ]]:\n  script: echo hi\n",
		"README", "readme\n")
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q", "-b", "main")
	git("add", "-A")
	git("commit", "-q", "-m", "first")
	lint := func(args ...string) string {
		t.Helper()
		out, err := runLint(t, append([]string{"--json", filepath.Join(dir, ".gitlab-ci.yml")}, args...)...)
		if err != nil {
			t.Fatalf("lint %v: %v\n%s", args, err, out)
		}
		var res lintResult
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatal(err)
		}
		if len(res.Unresolved) > 0 {
			t.Errorf("unresolved includes: %+v", res.Unresolved)
		}
		return jobNamesOf(res)
	}
	if got := lint(); got != "greet-lint,branch-only" {
		t.Errorf("main, nothing changed against main: %s, want greet-lint,branch-only", got)
	}
	git("checkout", "-q", "-b", "feature")
	os.MkdirAll(filepath.Join(dir, "src"), 0o755)
	os.WriteFile(filepath.Join(dir, "src", "x.go"), []byte("package x\n"), 0o644)
	git("add", "-A")
	git("commit", "-q", "-m", "release: x")
	if got := lint("--ref", "feature"); got != "greet-lint,src-changed,release-commit,branch-only" {
		t.Errorf("feature, src changed, a release commit: %s", got)
	}
	// greet-lint has no rules: GitLab's default only: [branches, tags]
	// keeps it out of merge request pipelines.
	if got := lint("--ref", "feature", "--source", "merge_request_event"); got != "src-changed,release-commit,mr-only" {
		t.Errorf("feature's merge request pipeline: %s", got)
	}
	// A merge request's changes are against its target branch (compare_to
	// still wins where it is given).
	os.WriteFile(filepath.Join(dir, "README"), []byte("changed\n"), 0o644)
	git("commit", "-q", "-am", "readme")
	if got := lint("--ref", "feature", "--source", "merge_request_event"); got != "src-changed,mr-only,readme-changed-in-mr" {
		t.Errorf("feature's merge request pipeline after a README change: %s", got)
	}
	if got := lint("--ref", "feature", "--source", "merge_request_event", "--target-branch", "feature"); got != "src-changed" {
		t.Errorf("a merge request into feature itself (nothing changed, mr-only wants main): %s", got)
	}
}

// TestLintRelativeAndAbsolutePaths: --root and FILE may be given one
// relative to the current directory and the other absolute.
func TestLintRelativeAndAbsolutePaths(t *testing.T) {
	dir := writeFiles(t, "sub/.gitlab-ci.yml", "j:\n  script: x\n")
	t.Chdir(dir)
	for _, args := range [][]string{
		{"--root", dir, "sub/.gitlab-ci.yml"},
		{"--root", ".", filepath.Join(dir, "sub", ".gitlab-ci.yml")},
		{"--root", "sub", ".gitlab-ci.yml"}, // outside the root
	} {
		out, err := runLint(t, args...)
		outside := args[1] == "sub"
		if (err != nil) != outside || (outside && !strings.Contains(err.Error(), "is not inside the root")) {
			t.Errorf("lint %v: %v\n%s", args, err, out)
		}
	}
}

// TestLintNeedsColumnIsBounded: a job needing many jobs does not widen
// the table; its row names the first few and how many more.
func TestLintNeedsColumnIsBounded(t *testing.T) {
	yml := ""
	var names []string
	for i := range 7 {
		yml += fmt.Sprintf("a%d:\n  stage: build\n  script: x\n", i)
		names = append(names, fmt.Sprintf("a%d", i))
	}
	yml += "t:\n  needs: [" + strings.Join(names, ", ") + "]\n  script: x\n"
	dir := writeFiles(t, ".gitlab-ci.yml", yml)
	out, err := runLint(t, filepath.Join(dir, ".gitlab-ci.yml"))
	if err != nil || !strings.Contains(out, "[a0, a1, a2, a3, … 3 more]") {
		t.Errorf("lint: %v\n%s", err, out)
	}
}

// In a git work tree, cache:key:files patterns match the files a commit
// would hold: an untracked or ignored file (build output) does not change
// the key, a tracked (even only staged) one does.
func TestLintCacheKeyTrackedFiles(t *testing.T) {
	dir := writeFiles(t, ".gitlab-ci.yml", "build:\n  script: x\n  cache:\n    key:\n      files: ['**/go.sum']\n    paths: [vendor/]\n",
		"mod/go.sum", "x", ".gitignore", "out/\n")
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	key := func() string {
		t.Helper()
		out, err := runLint(t, "--json", filepath.Join(dir, ".gitlab-ci.yml"))
		if err != nil {
			t.Fatalf("lint: %v\n%s", err, out)
		}
		var res struct {
			Pipeline struct {
				Jobs []struct{ Cache []struct{ Key string } }
			}
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Pipeline.Jobs) != 1 || len(res.Pipeline.Jobs[0].Cache) != 1 {
			t.Fatalf("%v\n%s", err, out)
		}
		return res.Pipeline.Jobs[0].Cache[0].Key
	}
	git("init", "-q", "-b", "main")
	git("add", "-A")
	git("commit", "-q", "-m", "first")
	// mod/go.sum alone: the digest of its blob id (as TestCILintJSON's key;
	// GitLab's "**/" does not match the root's own go.sum).
	const tracked = "a62431cba0b37e2d007cbe5eeec0bce7b8ec9c76"
	if k := key(); k != tracked {
		t.Fatalf("key %s, want %s", k, tracked)
	}
	for _, f := range []string{"out/go.sum", "scratch/go.sum"} { // ignored, untracked
		os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755)
		os.WriteFile(filepath.Join(dir, f), []byte("y"), 0o644)
	}
	if k := key(); k != tracked {
		t.Errorf("untracked files changed the key: %s", k)
	}
	git("add", "scratch/go.sum")
	if k := key(); k == tracked {
		t.Error("a staged file did not change the key")
	}
}
