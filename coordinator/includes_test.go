package coordinator

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/internal/includetest"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/internal/testenv"
)

func (e *env) createProjectVis(t *testing.T, path, visibility string) {
	t.Helper()
	r := e.adminDo("POST", "/api/v4/projects", restapi.CreateProjectRequest{Path: path, Visibility: visibility})
	expectCode(t, "create project "+path, r, http.StatusCreated)
}

// pushTag commits files on a branch of their own (tmp-TAG) and pushes
// that commit as tag.
func (e *env) pushTag(t *testing.T, project, tag string, files map[string]string) string {
	t.Helper()
	sha := e.pushFiles(t, project, "tmp-"+tag, files)
	dir := t.TempDir()
	testenv.Git(t, dir, nil, "init", "-q")
	remote := e.http.URL + "/" + project + ".git"
	testenv.Git(t, dir, testenv.GitBasicAuth("root", e.admin), "fetch", "-q", remote, "tmp-"+tag)
	testenv.Git(t, dir, testenv.GitBasicAuth("root", e.admin), "push", "-q", remote, "FETCH_HEAD:refs/tags/"+tag)
	return sha
}

func pipelineJobNames(t *testing.T, e *env, id int64) []string {
	t.Helper()
	jobs, err := e.st.ListJobs(context.Background(), store.JobFilter{PipelineID: id})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, j := range jobs {
		out = append(out, j.Name)
	}
	slices.Sort(out)
	return out
}

func TestIncludesFromHostedProjectsRemoteAndTemplates(t *testing.T) {
	rs := includetest.NewServer(t)
	templates := t.TempDir()
	if err := os.MkdirAll(filepath.Join(templates, "Jobs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(templates, "Jobs", "Build.gitlab-ci.yml"), []byte("template-build:\n  stage: build\n  script: [build]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newGitEnv(t, Config{Includes: pipelines.IncludeConfig{
		TemplatesDir:       templates,
		RemoteCAFile:       rs.CAFile,
		RemoteAllowPrivate: true, // the test server is on loopback
	}})
	host := e.http.Listener.Addr().String()

	e.createProjectVis(t, "group/app", "private")
	e.createProjectVis(t, "group/shared", "private")
	e.createProjectVis(t, "group/components", "private")
	e.createProjectVis(t, "pub/lib", "public")
	e.createProjectVis(t, "other/secret", "private")

	e.pushFiles(t, "group/shared", "main", map[string]string{
		"ci/build.yml":  "include: [{local: ci/common.yml}]\nshared-build:\n  extends: .common\n  script: [make]\n",
		"ci/common.yml": ".common:\n  stage: build\n",
	})
	e.pushTag(t, "group/shared", "v1", map[string]string{"ci/release.yml": "shared-release-v1:\n  stage: deploy\n  script: [release]\n"})
	e.pushFiles(t, "pub/lib", "main", map[string]string{"lib.yml": "public-lib:\n  stage: test\n  script: [lib]\n"})
	e.pushFiles(t, "other/secret", "main", map[string]string{"secret.yml": "secret:\n  script: [leak]\n"})
	lint := func(v string) map[string]string {
		// spec:component: the component context (name, the release the
		// address resolved to, the commit read).
		return map[string]string{"templates/lint/template.yml": "spec:\n  component: [name, version, sha]\n  inputs:\n    stage:\n      default: test\n---\nlint-" + v + ":\n  stage: $[[ inputs.stage ]]\n  script: [\"lint $[[ component.name ]] $[[ component.version ]] $[[ component.sha ]]\"]\n"}
	}
	e.pushTag(t, "group/components", "1.0.0", lint("1.0.0"))
	lintSHA := e.pushTag(t, "group/components", "1.1.0", lint("1.1.0"))
	e.pushTag(t, "group/components", "2.0.0-rc1", lint("2.0.0-rc1"))

	body := "remote-job:\n  stage: test\n  script: [remote]\n"
	sum := sha256.Sum256([]byte(body))
	cfg := `include:
  - project: group/shared
    file: ci/build.yml
  - project: group/shared
    ref: v1
    file: [ci/release.yml]
  - project: pub/lib
    file: lib.yml
  - remote: ` + rs.URL + `/ci/remote.yml
    integrity: sha256-` + base64.StdEncoding.EncodeToString(sum[:]) + `
  - template: Jobs/Build.gitlab-ci.yml
  - component: $CI_SERVER_FQDN/group/components/lint@~latest
    inputs:
      stage: deploy
stages: [build, test, deploy]
app:
  script: [app]
`
	e.pushFiles(t, "group/app", "main", map[string]string{".gitlab-ci.yml": cfg})
	ps, err := e.st.ListPipelines(t.Context(), store.PipelineFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var app *store.Pipeline
	for _, p := range ps {
		if p.Ref == "main" && p.YAMLErrors == "" && p.Status != store.StatusFailed {
			app = p
		}
	}
	if app == nil {
		for _, p := range ps {
			t.Logf("pipeline %d %s %s", p.ID, p.Status, p.YAMLErrors)
		}
		t.Fatal("no pipeline created for group/app")
	}
	want := []string{"app", "lint-1.1.0", "public-lib", "remote-job", "shared-build", "shared-release-v1", "template-build"}
	if got := pipelineJobNames(t, e, app.ID); !slices.Equal(got, want) {
		t.Fatalf("jobs %v, want %v", got, want)
	}
	if spec := string(e.latestJob(t, app.ID, "lint-1.1.0").Spec); !strings.Contains(spec, "lint lint 1.1.0 "+lintSHA) {
		t.Errorf("lint-1.1.0's spec %s, want the script \"lint lint 1.1.0 %s\"", spec, lintSHA)
	}

	// Every refusal is a configuration error of the pipeline, at the
	// include (API pipelines answer 400 with the errors).
	for _, tc := range []struct{ include, want string }{
		{"{project: other/secret, file: secret.yml}", "Project `other/secret` not found or access denied!"},
		{"{project: group/nothing, file: a.yml}", "Project `group/nothing` not found or access denied!"},
		{"{project: group/shared, ref: nope, file: ci/build.yml}", "Project `group/shared` reference `nope` does not exist!"},
		{"{project: group/shared, file: nope.yml}", "Project `group/shared` file `nope.yml` does not exist!"},
		{"{template: Nope.gitlab-ci.yml}", "Included file `Nope.gitlab-ci.yml` is empty or does not exist!"},
		{"{component: other.example.com/group/components/lint@1.0.0}", "the component path is not supported"},
		{"{component: " + host + "/other/secret/lint@1.0.0}", "project does not exist or you don't have sufficient permissions"},
		{"{component: " + host + "/group/components/lint@3}", "no release tag of group/components matches 3"},
		{"{component: " + host + "/group/components/nope@1.0.0}", "content not found"},
		{"{remote: '" + rs.URL + "/missing.yml'}", "could not be fetched because of HTTP code `404` error!"},
		{"{remote: '" + rs.URL + "/big.yml'}", "is larger than the limit of 1048576 bytes"},
		{"{remote: '" + rs.URL + "/redirect.yml'}", "because it redirected to http://" + rs.Listener.Addr().String() + "/ci/remote.yml, and plain http is not allowed by this server (use https)!"},
		{"{remote: 'http://" + rs.Listener.Addr().String() + "/ci/remote.yml'}", "plain http is not allowed by this server"},
	} {
		e.pushFiles(t, "group/app", "main", map[string]string{".gitlab-ci.yml": "include:\n  - " + tc.include + "\napp:\n  script: [app]\n"})
		r := e.adminDo("POST", "/api/v4/projects/group%2Fapp/pipeline?ref=main", nil)
		if r.code != http.StatusBadRequest || !strings.Contains(string(r.body), tc.want) || !strings.Contains(string(r.body), ".gitlab-ci.yml:2:") {
			t.Errorf("include %s: status %d body %s\nwant 400 with %q", tc.include, r.code, r.body, tc.want)
		}
	}
}

func TestIncludeTemplatesNeedADirectory(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "demo")
	e.pushFiles(t, "demo", "main", map[string]string{".gitlab-ci.yml": "include:\n  - template: Jobs/Build.gitlab-ci.yml\na:\n  script: [a]\n"})
	r := e.adminDo("POST", "/api/v4/projects/demo/pipeline?ref=main", nil)
	if r.code != http.StatusBadRequest || !strings.Contains(string(r.body), "Berth cannot ship GitLab's templates") ||
		!strings.Contains(string(r.body), "--ci-templates-dir") {
		t.Fatalf("status %d body %s", r.code, r.body)
	}
}

func TestPipelineInputsThroughTheAPI(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "demo")
	e.pushFiles(t, "demo", "main", map[string]string{".gitlab-ci.yml": "spec:\n  inputs:\n    n:\n      type: number\n    env:\n      options: [staging, production]\n---\ndeploy-$[[ inputs.env ]]:\n  parallel: $[[ inputs.n ]]\n  script: [deploy]\n"})
	r := e.adminDo("POST", "/api/v4/projects/demo/pipeline", restapi.CreatePipelineRequest{Ref: "main", Inputs: map[string]any{"n": 2, "env": "staging"}})
	expectCode(t, "create pipeline", r, http.StatusCreated)
	var pl restapi.PipelineJSON
	r.json(t, &pl)
	if got := pipelineJobNames(t, e, pl.ID); !slices.Equal(got, []string{"deploy-staging 1/2", "deploy-staging 2/2"}) {
		t.Fatalf("jobs %v", got)
	}
	r = e.adminDo("POST", "/api/v4/projects/demo/pipeline", restapi.CreatePipelineRequest{Ref: "main", Inputs: map[string]any{"n": 2}})
	if r.code != http.StatusBadRequest || !strings.Contains(string(r.body), "`env` input: required value has not been provided") {
		t.Fatalf("status %d body %s", r.code, r.body)
	}
}
