package runner

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runner/cache"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runnerapi"
)

// remoteEnv makes the shell executor's environments look remote: file
// stages then run as scripts with the helper binary inside the
// environment, as with docker, ssh or a VM, instead of in the runner's
// process.
type remoteEnv struct{ executor.Provider }

func (p remoteEnv) Create(ctx context.Context) (executor.Executor, error) {
	e, err := p.Provider.Create(ctx)
	return remoteExecutor{e}, err
}

type remoteExecutor struct{ executor.Executor }

func (e remoteExecutor) Prepare(ctx context.Context, o executor.PrepareOptions) (executor.Environment, error) {
	env, err := e.Executor.Prepare(ctx, o)
	env.Local = false
	return env, err
}

// TestEndToEndS3Cache runs jobs through the real coordinator and runners
// whose [runners.cache] is a real S3 server: the cache a job archives is
// an object where GitLab Runner would put it, uploaded and downloaded by
// the helper through pre-signed URLs, and found by a later job in another
// build directory — per runner unless Shared.
func TestEndToEndS3Cache(t *testing.T) {
	endpoint, access, secret, bucket := testenv.S3(t)
	e := newE2E(t)
	git := newGitServer(t)
	raw, err := minio.New(endpoint, &minio.Options{Creds: credentials.NewStaticV4(access, secret, ""), Region: "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	type runnerDirs struct{ token, dir string }
	runners := map[string]runnerDirs{}
	start := func(tag, path string, shared, remote bool, secretKey string) {
		dir := t.TempDir()
		var wrap func(executor.Provider) executor.Provider
		if remote {
			wrap = func(p executor.Provider) executor.Provider { return remoteEnv{p} }
		}
		_, tok := e.startRunnerWith(dir, restapi.CreateRunnerRequest{RunnerType: "instance_type", Description: tag, TagList: []string{tag}, RunUntagged: new(bool)},
			func(rc *config.Runner) {
				rc.Cache = &config.Cache{Type: "s3", Path: path, Shared: shared, S3: &config.CacheS3{
					ServerAddress: endpoint, AccessKey: access, SecretKey: secretKey, BucketName: bucket, BucketLocation: "us-east-1", Insecure: true,
				}}
			}, wrap)
		runners[tag] = runnerDirs{tok, dir}
	}
	start("a", "berth", false, false, secret) // in-process file stages
	start("b", "berth", false, true, secret)  // file stages as scripts
	start("c", "shared", true, false, secret)
	start("d", "shared", true, true, secret)
	start("bad", "berth", false, true, "not-the-secret")

	var traces []string
	run := func(tag, name string, c runnerapi.Cache, lines ...string) string {
		t.Helper()
		spec := dispatch.JobSpec{
			Name: name, ProjectID: 1, ProjectFullPath: "group/demo", RepoURL: git.url, Ref: "main", Sha: git.sha,
			Tags: []string{tag}, Cache: []runnerapi.Cache{c}, Steps: script(lines...),
		}
		id := e.enqueue(t, spec)
		j := e.waitDone(t, id)
		tr := e.trace(t, id)
		traces = append(traces, tr)
		if j.Status != "success" {
			t.Fatalf("%s on %s: %s %s\n%s", name, tag, j.Status, j.FailureReason, tr)
		}
		return tr
	}
	deps := runnerapi.Cache{Key: "deps-$CI_COMMIT_REF_NAME-non_protected", Paths: []string{"vendor/"}, Policy: "pull-push", When: "on_success"}
	probe := []string{"if [ -f vendor/dep.txt ]; then echo cache-hit=$(cat vendor/dep.txt); else echo cache-miss; fi",
		"mkdir -p vendor && echo from-$CI_JOB_NAME > vendor/dep.txt"}
	wantObject := func(name string) {
		t.Helper()
		if _, err := raw.StatObject(context.Background(), bucket, name, minio.StatObjectOptions{}); err != nil {
			t.Fatalf("no object %s in the bucket: %v", name, err)
		}
	}
	wantIn := func(tr string, wants ...string) {
		t.Helper()
		for _, w := range wants {
			if !strings.Contains(tr, w) {
				t.Fatalf("trace lacks %q:\n%s", w, tr)
			}
		}
	}

	t.Run("not shared: each runner has its namespace", func(t *testing.T) {
		wantIn(run("a", "a-1", deps, probe...), "cache-miss", "Uploaded cache deps-main-non_protected")
		wantObject("berth/runner/" + cache.ShortToken(runners["a"].token) + "/project/1/deps-main-non_protected")
		// Nothing went to the local cache directory.
		if zips, _ := filepath.Glob(filepath.Join(runners["a"].dir, "cache", "*", "*", "*", "cache.zip")); len(zips) > 0 {
			t.Errorf("an S3 cache wrote local archives: %v", zips)
		}
		// Another runner, same Path, not Shared: its own namespace.
		wantIn(run("b", "b-1", deps, probe...), "cache-miss", "Uploaded cache deps-main-non_protected")
		wantObject("berth/runner/" + cache.ShortToken(runners["b"].token) + "/project/1/deps-main-non_protected")
		// Runner a again, its build directories gone: the cache comes
		// from the bucket.
		if err := os.RemoveAll(filepath.Join(runners["a"].dir, "builds")); err != nil {
			t.Fatal(err)
		}
		wantIn(run("a", "a-2", deps, probe...), "cache-hit=from-a-1")
		wantIn(run("b", "b-2", deps, probe...), "cache-hit=from-b-1")
	})

	t.Run("shared: runners share the objects", func(t *testing.T) {
		wantIn(run("c", "c-1", deps, probe...), "cache-miss")
		wantObject("shared/project/1/deps-main-non_protected")
		wantIn(run("d", "d-1", deps, probe...), "cache-hit=from-c-1")
	})

	t.Run("fallback keys and a missing cache", func(t *testing.T) {
		feature := runnerapi.Cache{Key: "feature-x-non_protected", FallbackKeys: []string{"deps-main-non_protected"}, Paths: []string{"vendor/"}, Policy: "pull", When: "on_success"}
		wantIn(run("d", "d-fallback", feature, probe[0]), "No cache found for feature-x-non_protected", "Using fallback cache deps-main-non_protected", "cache-hit=from-d-1")
		none := runnerapi.Cache{Key: "nothing-here-non_protected", Paths: []string{"vendor/"}, Policy: "pull", When: "on_success"}
		wantIn(run("c", "c-none", none, probe[0]), "WARNING: Cache not found; continuing without it", "cache-miss")
	})

	t.Run("a refused download and upload only warn", func(t *testing.T) {
		tr := run("bad", "bad-1", deps, probe...)
		wantIn(tr, "403 Forbidden", "WARNING: Failed to extract cache", "WARNING: Failed to create cache", "cache-miss")
	})

	for _, tr := range traces {
		if strings.Contains(tr, "X-Amz-Signature=") || strings.Contains(tr, secret) || strings.Contains(tr, "X-Amz-Credential") {
			t.Fatalf("a job log shows a pre-signed URL or the secret key:\n%s", tr)
		}
	}
}
