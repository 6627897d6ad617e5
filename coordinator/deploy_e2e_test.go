package coordinator

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// deployProject creates a project (public when asked), pushes files
// without a pipeline and creates the pipeline through the API.
func deployProject(t *testing.T, e *env, path, visibility string, files map[string]string) (restapi.ProjectJSON, restapi.PipelineJSON) {
	t.Helper()
	r := e.adminDo("GET", "/api/v4/projects/"+url.PathEscape(path), nil)
	if r.code == http.StatusNotFound {
		r = e.adminDo("POST", "/api/v4/projects", restapi.CreateProjectRequest{Path: path, Visibility: visibility})
		expectCode(t, "create project", r, http.StatusCreated)
	}
	var proj restapi.ProjectJSON
	r.json(t, &proj)
	e.pushFiles(t, path, "main", files, "-o", "ci.skip")
	r = e.adminDo("POST", fmt.Sprintf("/api/v4/projects/%d/pipeline?ref=main", proj.ID), nil)
	expectCode(t, "create pipeline", r, http.StatusCreated)
	var pl restapi.PipelineJSON
	r.json(t, &pl)
	return proj, pl
}

// jobPlay is what a test runner does with a job: files to upload as its
// artifacts archive, and the final state.
type jobPlay struct {
	files  map[string]string
	failed bool
}

// runOne takes one job, if one is queued, and plays it: ack, artifacts,
// final state. It returns the job (nil when none was queued).
func (e *env) runOne(t *testing.T, tok string, play func(*runnerapi.JobResponse) jobPlay) *runnerapi.JobResponse {
	t.Helper()
	_, job := e.request(tok, "s_deploy", "")
	if job == nil {
		return nil
	}
	expectCode(t, "ack", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	p := play(job)
	if p.files != nil {
		e.uploadArchive(t, job, p.files)
	}
	req := runnerapi.UpdateJobRequest{State: "success"}
	if p.failed {
		req = runnerapi.UpdateJobRequest{State: "failed", FailureReason: "script_failure", ExitCode: 1}
	}
	expectCode(t, "finish "+job.JobInfo.Name, e.update(job, req), http.StatusOK)
	return job
}

// runAll plays jobs until the pipeline has none left to run.
func (e *env) runAll(t *testing.T, tok string, pipeline int64, play func(*runnerapi.JobResponse) jobPlay) map[string]*runnerapi.JobResponse {
	t.Helper()
	seen := map[string]*runnerapi.JobResponse{}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if job := e.runOne(t, tok, play); job != nil {
			seen[job.JobInfo.Name] = job
			continue
		}
		st, err := e.srv.pipelines.PipelineState(t.Context(), pipeline)
		if err != nil {
			t.Fatal(err)
		}
		busy := false
		for _, j := range st.Jobs {
			if j.Status == store.StatusCreated || j.Status == store.StatusPending || j.Status == store.StatusRunning {
				busy = true
			}
		}
		if !busy {
			return seen
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatal("timed out running the pipeline's jobs")
	return nil
}

func jobByName(t *testing.T, e *env, pipeline int64, name string) *store.Job {
	t.Helper()
	st, err := e.srv.pipelines.PipelineState(t.Context(), pipeline)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range st.Jobs {
		if j.Name == name && !j.Retried {
			return j
		}
	}
	t.Fatalf("no job %s in pipeline %d", name, pipeline)
	return nil
}

const releaseConfig = `
stages: [build, deploy, .post]
release:
  stage: deploy
  script: [make changelog]
  variables:
    VERSION: "1.2.0"
  artifacts:
    paths: [notes/]
  release:
    tag_name: v$VERSION
    tag_message: Version $VERSION
    name: Release $VERSION on $CI_COMMIT_REF_NAME
    description: ./notes/CHANGES.md
    milestones: [m1]
    assets:
      links:
        - name: app-$VERSION
          url: https://dl.example.test/app-$VERSION.tar.gz
          link_type: package
          direct_asset_path: bin/app
branch-release:
  stage: deploy
  script: [x]
  release:
    tag_name: at-ref
    description: Built from the ref
    ref: other
again:
  stage: .post
  script: [x]
  release:
    tag_name: v1.2.0
    description: same tag again
`

// TestReleaseCreatedWhenJobSucceeds: the release keyword creates the
// release, and its tag in the hosted repository, when the job succeeds;
// a release that exists already fails the job, as release-cli would.
func TestReleaseCreatedWhenJobSucceeds(t *testing.T) {
	e := newGitEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	otherSha := e.pushFilesNew(t, "group/rel", "other", map[string]string{"other.txt": "x"})
	proj, pl := deployProject(t, e, "group/rel", "", map[string]string{".gitlab-ci.yml": releaseConfig})
	e.runAll(t, tok, pl.ID, func(job *runnerapi.JobResponse) jobPlay {
		if job.JobInfo.Name == "release" {
			return jobPlay{files: map[string]string{"notes/CHANGES.md": "## 1.2.0\n\n- shiny\n"}}
		}
		return jobPlay{}
	})
	if j := jobByName(t, e, pl.ID, "release"); j.Status != store.StatusSuccess {
		t.Fatalf("release job %s (%s)", j.Status, j.FailureReason)
	}
	again := jobByName(t, e, pl.ID, "again")
	if again.Status != store.StatusFailed || again.FailureReason != "script_failure" {
		t.Errorf("a second release of the tag: job %s (%s), want failed script_failure", again.Status, again.FailureReason)
	}
	var trace bytes.Buffer
	if _, err := e.st.ReadTrace(t.Context(), again.ID, 0, &trace); err != nil || !strings.Contains(trace.String(), "ERROR: Berth could not create the release: release v1.2.0 already exists") {
		t.Errorf("trace of the failed release job = %q, %v", trace.String(), err)
	}

	// The tag exists in the hosted repository: annotated, at the commit.
	repo := e.srv.git.RepoPath(proj.ID)
	if got := testenv.Git(t, repo, nil, "rev-parse", "v1.2.0^{commit}"); got != pl.Sha {
		t.Errorf("tag v1.2.0 at %s, want the pipeline's commit %s", got, pl.Sha)
	}
	if got := testenv.Git(t, repo, nil, "cat-file", "-t", "v1.2.0"); got != "tag" {
		t.Errorf("tag v1.2.0 is a %s object, want an annotated tag", got)
	}
	if got := testenv.Git(t, repo, nil, "cat-file", "-p", "v1.2.0"); !strings.Contains(got, "Version 1.2.0") {
		t.Errorf("tag message: %s", got)
	}
	// release:ref: the tag is made at that ref, lightweight.
	if got := testenv.Git(t, repo, nil, "rev-parse", "at-ref"); got != otherSha {
		t.Errorf("tag at-ref at %s, want branch other's commit %s", got, otherSha)
	}

	r := e.adminDo("GET", fmt.Sprintf("/api/v4/projects/%d/releases", proj.ID), nil)
	expectCode(t, "list releases", r, http.StatusOK)
	var rels []restapi.ReleaseJSON
	r.json(t, &rels)
	if len(rels) != 2 {
		t.Fatalf("releases = %+v, want 2", rels)
	}
	r = e.adminDo("GET", "/api/v4/projects/group%2Frel/releases/v1.2.0", nil)
	expectCode(t, "get release", r, http.StatusOK)
	var rel restapi.ReleaseJSON
	r.json(t, &rel)
	if rel.Name != "Release 1.2.0 on main" || rel.Description != "## 1.2.0\n\n- shiny\n" || rel.Commit.ID != pl.Sha ||
		len(rel.Milestones) != 1 || rel.Milestones[0].Title != "m1" || rel.Assets.Count != 1 {
		t.Errorf("release = %+v", rel)
	}
	if l := rel.Assets.Links[0]; l.Name != "app-1.2.0" || l.URL != "https://dl.example.test/app-1.2.0.tar.gz" || l.LinkType != "package" || l.DirectAssetPath != "/bin/app" {
		t.Errorf("link = %+v", l)
	}
	expectCode(t, "missing release", e.adminDo("GET", "/api/v4/projects/group%2Frel/releases/v9", nil), http.StatusNotFound)
	r = e.adminDo("GET", "/api/v4/projects/group%2Frel/releases/at-ref", nil)
	expectCode(t, "get release at-ref", r, http.StatusOK)
	r.json(t, &rel)
	if rel.Name != "at-ref" || rel.Commit.ID != otherSha || rel.Description != "Built from the ref" {
		t.Errorf("release at ref = %+v", rel)
	}
}

// pushFilesNew pushes files as the first commit of a new branch of a
// project, creating the project; it returns the commit.
func (e *env) pushFilesNew(t *testing.T, project, branch string, files map[string]string) string {
	t.Helper()
	e.createProject(t, project)
	return e.pushFiles(t, project, branch, files, "-o", "ci.skip")
}

const pagesConfig = `
pages:
  script: [build]
  pages:
    expire_in: 1 hour
review:
  script: [build]
  pages:
    publish: site
    path_prefix: mr-$CI_PIPELINE_IID
`

// TestPagesDeployedAndServed: a Pages job's site is deployed from its
// artifacts and served below /-/pages/, with index.html, 404.html,
// content types, parallel deployments under a prefix, no way out of the
// site, and expiry.
func TestPagesDeployedAndServed(t *testing.T) {
	e := newGitEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	proj, pl := deployProject(t, e, "group/site", "public", map[string]string{".gitlab-ci.yml": pagesConfig})
	jobs := e.runAll(t, tok, pl.ID, func(job *runnerapi.JobResponse) jobPlay {
		if job.JobInfo.Name == "review" {
			return jobPlay{files: map[string]string{"site/index.html": "<p>review</p>"}}
		}
		return jobPlay{files: map[string]string{
			"public/index.html": "<p>home</p>", "public/404.html": "<p>lost</p>", "public/style.css": "p{}",
			"public/docs/index.html": "<p>docs</p>", "secret.txt": "not published",
		}}
	})
	base := e.http.URL + "/-/pages/group/site"
	if v, _ := variable(jobs["review"], "CI_PAGES_URL"); v.Value != base+"/mr-1" {
		t.Errorf("CI_PAGES_URL of the prefixed job = %q, want %s/mr-1", v.Value, base)
	}
	if v, _ := variable(jobs["pages"], "CI_PAGES_URL"); v.Value != base {
		t.Errorf("CI_PAGES_URL = %q, want %s", v.Value, base)
	}
	if v, _ := variable(jobs["pages"], "CI_PAGES_HOSTNAME"); v.Value != "127.0.0.1" {
		t.Errorf("CI_PAGES_HOSTNAME = %q", v.Value)
	}
	waitFor(t, "both Pages deployments", func() bool {
		ds, _ := e.st.ListPagesDeployments(t.Context(), proj.ID)
		return len(ds) == 2
	})

	get := func(path string) (int, string, http.Header) {
		t.Helper()
		c := e.http.Client()
		c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		req, _ := http.NewRequest("GET", e.http.URL+path, nil)
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b), res.Header
	}
	for _, tt := range []struct {
		path, body, ctype string
		code              int
	}{
		{"/-/pages/group/site/", "<p>home</p>", "text/html; charset=utf-8", 200},
		{"/-/pages/group/site", "<p>home</p>", "text/html; charset=utf-8", 200},
		{"/-/pages/group/site/index.html", "<p>home</p>", "text/html; charset=utf-8", 200},
		{"/-/pages/group/site/style.css", "p{}", "text/css; charset=utf-8", 200},
		{"/-/pages/group/site/docs/", "<p>docs</p>", "text/html; charset=utf-8", 200},
		{"/-/pages/group/site/nope.html", "<p>lost</p>", "text/html; charset=utf-8", 404},
		{"/-/pages/group/site/secret.txt", "<p>lost</p>", "", 404},
		{"/-/pages/group/site/%2e%2e/secret.txt", "<p>lost</p>", "", 404},
		{"/-/pages/group/site/..%2f..%2f..%2fberth.db", "<p>lost</p>", "", 404},
		{"/-/pages/group/site/mr-1/", "<p>review</p>", "", 200},
		{"/-/pages/group/nothing/", "", "", 404},
	} {
		code, body, h := get(tt.path)
		if tt.body != "" { // served from the site
			if csp := h.Get("Content-Security-Policy"); !strings.HasPrefix(csp, "sandbox ") || strings.Contains(csp, "allow-same-origin") {
				t.Errorf("GET %s: Content-Security-Policy %q, want a sandbox without allow-same-origin", tt.path, csp)
			}
		}
		if code != tt.code || (tt.body != "" && body != tt.body) || (tt.ctype != "" && h.Get("Content-Type") != tt.ctype) {
			t.Errorf("GET %s = %d %q (%s), want %d %q (%s)", tt.path, code, body, h.Get("Content-Type"), tt.code, tt.body, tt.ctype)
		}
	}
	if code, _, h := get("/-/pages/group/site/docs"); code != http.StatusFound || h.Get("Location") != "/-/pages/group/site/docs/" {
		t.Errorf("directory without its slash: %d to %q, want a redirect to docs/", code, h.Get("Location"))
	}

	r := e.adminDo("GET", fmt.Sprintf("/api/v4/projects/%d/pages", proj.ID), nil)
	expectCode(t, "get pages", r, http.StatusOK)
	var pj restapi.PagesJSON
	r.json(t, &pj)
	if pj.URL != base+"/" || len(pj.Deployments) != 2 || pj.Deployments[0].PathPrefix != "" || pj.Deployments[0].RootDirectory != "public" ||
		pj.Deployments[1].URL != base+"/mr-1/" || pj.Deployments[1].RootDirectory != "site" || pj.Deployments[0].ExpiresAt == nil {
		t.Errorf("pages = %+v", pj)
	}

	// Deploying again swaps the site: the new one is served, the old
	// directory is gone.
	before, _ := e.st.ListPagesDeployments(t.Context(), proj.ID)
	var review *store.PagesDeployment
	for _, d := range before {
		if d.PathPrefix == "mr-1" {
			review = d
		}
	}
	d, err := e.srv.pages.Deploy(t.Context(), jobByName(t, e, pl.ID, "review").ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	pdir := filepath.Join(e.srv.pages.Dir(), strconv.FormatInt(proj.ID, 10))
	if review == nil || review.Dir == d.Dir {
		t.Fatalf("deployments before the swap %+v, new %+v", before, d)
	}
	if _, err := os.Stat(filepath.Join(pdir, review.Dir)); !os.IsNotExist(err) {
		t.Errorf("the replaced deployment's directory is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(pdir, d.Dir, "index.html")); err != nil {
		t.Errorf("new deployment: %v", err)
	}
	if code, body, _ := get("/-/pages/group/site/mr-1/"); code != 200 || body != "<p>review</p>" {
		t.Errorf("after the swap: %d %q", code, body)
	}

	// expire_in: the main site goes after an hour; the prefixed one
	// keeps its default of a day.
	e.clock.Advance(2 * time.Hour)
	if err := e.srv.Reap(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := get("/-/pages/group/site/"); code != http.StatusNotFound {
		t.Errorf("expired site: %d, want 404", code)
	}
	if _, err := os.Stat(filepath.Join(pdir, before[0].Dir)); !os.IsNotExist(err) {
		t.Errorf("the expired deployment's directory is still there: %v", err)
	}
	if code, _, _ := get("/-/pages/group/site/mr-1/"); code != 200 {
		t.Errorf("prefixed site after an hour: %d, want 200", code)
	}
	e.clock.Advance(24 * time.Hour)
	_ = e.srv.Reap(context.Background())
	if code, _, _ := get("/-/pages/group/site/mr-1/"); code != http.StatusNotFound {
		t.Errorf("prefixed site after a day: %d, want 404", code)
	}
}

// TestPrivatePagesNeedTheAdminToken: a private project's site is not
// public.
func TestPrivatePagesNeedTheAdminToken(t *testing.T) {
	e := newGitEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	proj, pl := deployProject(t, e, "priv", "private", map[string]string{".gitlab-ci.yml": "pages:\n  script: [x]\n"})
	e.runAll(t, tok, pl.ID, func(*runnerapi.JobResponse) jobPlay {
		return jobPlay{files: map[string]string{"public/index.html": "private"}}
	})
	waitFor(t, "the deployment", func() bool {
		ds, _ := e.st.ListPagesDeployments(t.Context(), proj.ID)
		return len(ds) == 1
	})
	if r := e.do("GET", "/-/pages/priv/", nil, nil); r.code != http.StatusNotFound {
		t.Errorf("anonymous: %d", r.code)
	}
	if r := e.adminDo("GET", "/-/pages/priv/", nil); r.code != http.StatusOK || string(r.body) != "private" {
		t.Errorf("admin: %d %q", r.code, r.body)
	}
}

const environmentsConfig = `
stages: [deploy, cleanup]
deploy:
  stage: deploy
  script: [deploy]
  variables:
    REVIEW_TTL: 1 day
  environment:
    name: review/$CI_COMMIT_REF_NAME
    url: https://$CI_ENVIRONMENT_SLUG.example.test
    on_stop: stop
    auto_stop_in: $REVIEW_TTL
prod:
  stage: deploy
  script: [deploy]
  allow_failure: true
  environment:
    name: production
    deployment_tier: production
verify:
  stage: deploy
  script: [check]
  environment:
    name: production
    action: verify
rollback:
  stage: cleanup
  script: [rollback]
  when: on_failure
  environment: staging
stop:
  stage: cleanup
  script: [stop]
  when: manual
  environment:
    name: review/$CI_COMMIT_REF_NAME
    action: stop
`

// TestDeploymentsFollowJobs: jobs with environment create deployments
// whose status follows the job; environments are created with the first
// deployment, started by success, stopped by a stop job (played by
// auto_stop_in) or the API.
func TestDeploymentsFollowJobs(t *testing.T) {
	e := newGitEnv(t, Config{})
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	proj, pl := deployProject(t, e, "group/app", "", map[string]string{".gitlab-ci.yml": environmentsConfig})
	api := fmt.Sprintf("/api/v4/projects/%d", proj.ID)
	deployments := func(query string) []restapi.DeploymentJSON {
		t.Helper()
		r := e.adminDo("GET", api+"/deployments"+query, nil)
		expectCode(t, "list deployments", r, http.StatusOK)
		var ds []restapi.DeploymentJSON
		r.json(t, &ds)
		return ds
	}
	environments := func(query string) map[string]restapi.EnvironmentJSON {
		t.Helper()
		r := e.adminDo("GET", api+"/environments"+query, nil)
		expectCode(t, "list environments", r, http.StatusOK)
		var es []restapi.EnvironmentJSON
		r.json(t, &es)
		m := map[string]restapi.EnvironmentJSON{}
		for _, x := range es {
			m[x.Name] = x
		}
		return m
	}
	statuses := func() string {
		var out []string
		for _, d := range deployments("") {
			out = append(out, d.Deployable.Name+"="+d.Status)
		}
		return strings.Join(out, " ")
	}

	// Created with the pipeline: one deployment per deploying job, the
	// environments with them.
	if got := statuses(); got != "deploy=created prod=created rollback=created" {
		t.Fatalf("deployments at creation: %s", got)
	}
	envs := environments("")
	slugName := pipelines.EnvironmentSlug("review/main")
	if len(envs) != 3 || envs["review/main"].Slug != slugName || envs["production"].Tier != "production" || envs["staging"].Tier != "staging" ||
		envs["review/main"].Tier != "development" || *envs["review/main"].ExternalURL != "https://"+slugName+".example.test" {
		t.Fatalf("environments at creation: %+v", envs)
	}

	// Take deploy and hold it running.
	_, job := e.request(tok, "s_deploy", "")
	if job == nil || job.JobInfo.Name != "deploy" {
		t.Fatalf("first job: %+v", job)
	}
	for k, want := range map[string]string{"CI_ENVIRONMENT_NAME": "review/main", "CI_ENVIRONMENT_SLUG": slugName,
		"CI_ENVIRONMENT_URL": "https://" + slugName + ".example.test", "CI_ENVIRONMENT_ACTION": "start", "CI_ENVIRONMENT_TIER": "development"} {
		if v, _ := variable(job, k); v.Value != want {
			t.Errorf("%s = %q, want %q", k, v.Value, want)
		}
	}
	expectCode(t, "ack", e.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	waitFor(t, "the deployment to run", func() bool { return strings.HasPrefix(statuses(), "deploy=running") })
	expectCode(t, "finish", e.update(job, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)
	finished := e.clock.Now()

	e.runAll(t, tok, pl.ID, func(job *runnerapi.JobResponse) jobPlay {
		if job.JobInfo.Name == "verify" {
			if v, _ := variable(job, "CI_ENVIRONMENT_ACTION"); v.Value != "verify" {
				t.Errorf("verify: CI_ENVIRONMENT_ACTION = %q", v.Value)
			}
		}
		return jobPlay{failed: job.JobInfo.Name == "prod"}
	})
	waitFor(t, "deployments to follow their jobs", func() bool {
		return statuses() == "deploy=success prod=failed rollback=skipped"
	})
	// verify does not deploy; filters.
	if ds := deployments("?environment=production&status=failed"); len(ds) != 1 || ds[0].Deployable.Name != "prod" || ds[0].Environment.Name != "production" {
		t.Errorf("filtered deployments: %+v", ds)
	}
	if ds := deployments("?order_by=iid&sort=desc"); len(ds) != 3 || ds[0].IID != 3 || ds[2].IID != 1 {
		t.Errorf("deployments by iid, descending: %+v", ds)
	}
	if ds := deployments("?environment=nowhere"); len(ds) != 0 {
		t.Errorf("deployments of a missing environment: %+v", ds)
	}
	review := environments("")["review/main"]
	want := finished.Add(24 * time.Hour).UTC().Format(time.RFC3339)
	if review.State != "available" || review.AutoStopAt == nil || *review.AutoStopAt != want {
		t.Errorf("review environment after its deployment: %+v (auto stop want %s)", review, want)
	}
	r := e.adminDo("GET", fmt.Sprintf("%s/environments/%d", api, review.ID), nil)
	expectCode(t, "get environment", r, http.StatusOK)
	var one restapi.EnvironmentJSON
	r.json(t, &one)
	if one.LastDeployment == nil || one.LastDeployment.Deployable.Name != "deploy" || one.LastDeployment.Status != "success" {
		t.Errorf("environment's last deployment: %+v", one.LastDeployment)
	}

	// auto_stop_in: a day later the reaper plays the on_stop job, whose
	// success stops the environment.
	e.clock.Advance(25 * time.Hour)
	if err := e.srv.Reap(context.Background()); err != nil {
		t.Fatal(err)
	}
	if j := jobByName(t, e, pl.ID, "stop"); j.Status != store.StatusPending {
		t.Fatalf("stop job after auto stop: %s, want pending (played)", j.Status)
	}
	if got := environments("?states=available")["review/main"]; got.State != "available" {
		t.Errorf("environment stops only when its stop job succeeds: %+v", got)
	}
	e.runAll(t, tok, pl.ID, func(*runnerapi.JobResponse) jobPlay { return jobPlay{} })
	waitFor(t, "the environment to stop", func() bool { return environments("?states=stopped")["review/main"].State == "stopped" })

	// The API stops an environment without an on_stop job at once.
	prod := environments("")["production"]
	r = e.adminDo("POST", fmt.Sprintf("%s/environments/%d/stop", api, prod.ID), nil)
	expectCode(t, "stop environment", r, http.StatusOK)
	r.json(t, &one)
	if one.State != "stopped" {
		t.Errorf("stopped environment: %+v", one)
	}
	expectCode(t, "stop a missing environment", e.adminDo("POST", fmt.Sprintf("%s/environments/%d/stop", api, prod.ID+100), nil), http.StatusNotFound)

	// A retried deploy is a new deployment, and it starts the stopped
	// environment again.
	r = e.adminDo("POST", fmt.Sprintf("%s/jobs/%d/retry", api, jobByName(t, e, pl.ID, "deploy").ID), nil)
	expectCode(t, "retry deploy", r, http.StatusCreated)
	e.runAll(t, tok, pl.ID, func(*runnerapi.JobResponse) jobPlay { return jobPlay{} })
	waitFor(t, "the new deployment", func() bool { return len(deployments("")) == 4 })
	waitFor(t, "the environment to start again", func() bool { return environments("")["review/main"].State == "available" })
}
