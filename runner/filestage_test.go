package runner

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runner/cache"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runner/helper"
	"github.com/berthci/berth/runnerapi"
)

func TestRunFileSteps(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "file-variables")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	var calls [][]string
	run := func(code int) func(context.Context, []string, io.Writer) int {
		return func(_ context.Context, args []string, out io.Writer) int {
			calls = append(calls, args)
			io.WriteString(out, "helper says hi\n")
			return code
		}
	}
	steps := []fileStep{
		{color: ansiBoldGreen, msg: "Checking cache for k..."},
		{args: []string{"cache-extract", "--file", "f"}, orWarn: "WARNING: Failed to extract cache"},
		{args: []string{"artifacts-download", "--id", "3"}, token: "glcbt-secret"},
		{removeAll: dir},
	}
	var out strings.Builder
	err := runFileSteps(t.Context(), "x", steps, &out, run(1))
	var ee *executor.ExitError
	// The cache failure only warns; the download failing fails the stage
	// with its status, before the removal.
	if !errors.As(err, &ee) || ee.Code != 1 || ee.Stage != "x" {
		t.Fatalf("err %v, want exit status 1 of stage x", err)
	}
	want := ansiBoldGreen + "Checking cache for k..." + ansiReset + "\nhelper says hi\nWARNING: Failed to extract cache\nhelper says hi\n"
	if out.String() != want {
		t.Errorf("output %q, want %q", out.String(), want)
	}
	if len(calls) != 2 || strings.Join(calls[1], " ") != "artifacts-download --id 3 --token glcbt-secret" {
		t.Errorf("helper calls %q: the token goes as --token to the in-process helper", calls)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Error("the directory was removed after the stage failed")
	}

	calls, out = nil, strings.Builder{}
	if err := runFileSteps(t.Context(), "x", steps, &out, run(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("removeAll left %s (%v)", dir, err)
	}
	err = runFileSteps(t.Context(), "x", []fileStep{{color: ansiBoldRed, msg: "ERROR: unknown cache policy", fail: true}}, &out, run(0))
	if !errors.As(err, &ee) || ee.Code != 1 {
		t.Errorf("a failing step: %v, want exit status 1", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := runFileSteps(ctx, "x", steps, io.Discard, run(0)); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled: %v", err)
	}
}

// The script rendering of the same steps, for environments that are not
// the runner's: the helper in the environment, the token in its
// environment (never on its command line), warnings and failures as sh.
func TestFileScript(t *testing.T) {
	s := &scripts{env: executor.Environment{Helper: "/opt/berth"}, projectDir: "/b/p"}
	got := s.fileScript([]fileStep{
		{color: ansiBoldGreen, msg: "Downloading artifacts for a (1)..."},
		{args: []string{"artifacts-download", "--id", "1"}, token: "glcbt-x"},
		{args: []string{"cache-extract", "--file", "it's"}, orWarn: "WARNING: Failed to extract cache"},
		{msg: "bad", fail: true},
	})
	for _, want := range []string{
		"cd '/b/p'\n",
		"BERTH_JOB_TOKEN='glcbt-x' '/opt/berth' helper 'artifacts-download' '--id' '1'\n",
		`'/opt/berth' helper 'cache-extract' '--file' 'it'\''s' || echo 'WARNING: Failed to extract cache'` + "\n",
		"exit 1\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("script lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "--token") {
		t.Errorf("the token is on the helper's command line:\n%s", got)
	}
	if got := s.fileScript(nil); got != "" {
		t.Errorf("no steps: %q, want no stage", got)
	}
	if got := s.fileScript([]fileStep{{removeAll: "/b/p.tmp/file-variables"}}); got != "rm -rf '/b/p.tmp/file-variables'\n" {
		t.Errorf("cleanup script %q", got)
	}
}

// get_sources with a refs digest is valid sh and bash (syntax), and only
// bash reads the record without cat.
func TestGetSourcesScriptSyntax(t *testing.T) {
	for _, shell := range []string{"sh", "bash"} {
		t.Run(shell, func(t *testing.T) {
			if _, err := exec.LookPath(shell); err != nil {
				t.Skip(err)
			}
			job := &runnerapi.JobResponse{AllowGitFetch: true, GitInfo: runnerapi.GitInfo{
				RepoURL: "http://gitlab-ci-token:t@127.0.0.1:1/g/p.git", Ref: "main", Sha: strings.Repeat("a", 40),
				Refspecs: []string{"+refs/pipelines/1:refs/pipelines/1", "+refs/heads/*:refs/remotes/origin/*"}, Depth: 20,
				RefsDigest: strings.Repeat("0f", 32),
			}}
			s := &scripts{job: job, rc: &config.Runner{}, env: executor.Environment{Shell: shell}, projectDir: "/b/p"}
			script := s.getSources()
			if !strings.Contains(script, "Skipping the fetch") || !strings.Contains(script, "'refs/remotes/origin'") {
				t.Fatalf("no skip check:\n%s", script)
			}
			if got := strings.Contains(script, "$(cat .git/berth-fetched)"); got != (shell == "sh") {
				t.Errorf("cat used: %v\n%s", got, script)
			}
			if out, err := exec.Command(shell, "-n", "-c", script).CombinedOutput(); err != nil {
				t.Fatalf("%s -n: %v %s\n%s", shell, err, out, script)
			}
		})
	}
	// Without a digest (a GitLab server), every job fetches.
	s := &scripts{job: &runnerapi.JobResponse{GitInfo: runnerapi.GitInfo{RepoURL: "http://x/g/p.git", Sha: strings.Repeat("a", 40)}},
		rc: &config.Runner{}, env: executor.Environment{Shell: "bash"}, projectDir: "/b/p"}
	if script := s.getSources(); strings.Contains(script, "berth-fetched") || !strings.Contains(script, "git fetch origin") {
		t.Errorf("without a digest:\n%s", script)
	}
}

// With a distributed cache the stages carry pre-signed URLs: in a script
// through the helper's environment, in process as --url; never on a
// command line, always masked in the log.
func TestRemoteCacheSteps(t *testing.T) {
	remote, err := cache.NewS3(&config.Cache{Type: "s3", Path: "p", S3: &config.CacheS3{
		ServerAddress: "127.0.0.1:1", AccessKey: "AK", SecretKey: "SK", BucketName: "bucket", BucketLocation: "us-east-1", Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	var masked []string
	job := &runnerapi.JobResponse{JobInfo: runnerapi.JobInfo{ProjectID: 9}, Cache: []runnerapi.Cache{
		{Key: "deps-non_protected", FallbackKeys: []string{"main-non_protected", "../escape-non_protected"}, Paths: []string{"vendor/"}, Policy: "pull-push"},
	}}
	s := &scripts{job: job, rc: &config.Runner{}, env: executor.Environment{Helper: "/opt/berth"}, projectDir: "/b/p",
		remote: remote, runnerToken: "glrt-abcdefghijkl", urlExpiry: time.Hour, mask: func(v ...string) { masked = append(masked, v...) }}

	restore := s.restoreCache(t.Context())
	var extract *fileStep
	for i := range restore {
		if restore[i].args != nil {
			extract = &restore[i]
		}
	}
	if extract == nil || len(extract.urls) != 2 || strings.Join(extract.args, " ") != "cache-extract --dir /b/p --key deps-non_protected --key main-non_protected" || extract.orWarn == "" {
		t.Fatalf("restore steps %+v", restore)
	}
	if !strings.Contains(extract.urls[0], "/bucket/p/runner/abcdefghi/project/9/deps-non_protected?") {
		t.Errorf("download URL %s", extract.urls[0])
	}
	if !strings.Contains(restore[1].msg, `cache ..%2Fescape-non_protected: cache key "../escape-non_protected" leaves the project's cache`) {
		t.Errorf("the escaping fallback key is not a warning: %+v", restore)
	}
	archive := s.archiveCache(t.Context(), false)
	if len(archive) != 2 || len(archive[1].urls) != 1 || archive[1].orWarn == "" ||
		strings.Join(archive[1].args, " ") != "cache-archive --dir /b/p --key deps-non_protected --path vendor/" {
		t.Fatalf("archive steps %+v", archive)
	}
	if len(masked) != 3 || masked[0] == "" {
		t.Errorf("masked %q, want the 3 signatures", masked)
	}

	script := s.fileScript(restore)
	if !strings.Contains(script, helper.CacheURLsEnv+"='http://127.0.0.1:1/bucket/p/runner/abcdefghi/project/9/deps-non_protected?") ||
		strings.Contains(script, "--url") {
		t.Errorf("script:\n%s", script)
	}
	var got []string
	runFileSteps(t.Context(), "restore_cache", restore, io.Discard, func(_ context.Context, args []string, _ io.Writer) int {
		got = args
		return 0
	})
	if n := strings.Count(strings.Join(got, " "), "--url http://127.0.0.1:1/bucket/"); n != 2 {
		t.Errorf("in process: %q, want 2 --url", got)
	}
}

// clean_git_config's removal, in this process (removeGitConfigs) and as
// the command a job's environment runs (gitConfigCleanup), does the same
// to one repository: its config and hooks go, and with submodules every
// submodule's too; objects, refs and the checkout stay.
func TestGitConfigCleanupBothWays(t *testing.T) {
	testenv.LookPath(t, "bash")
	testenv.LookPath(t, "find")
	layout := []string{
		".git/config", ".git/hooks/post-checkout", ".git/HEAD", ".git/objects/ab/cdef", ".git/refs/heads/main",
		".git/modules/sub/config", ".git/modules/sub/hooks/pre-commit", ".git/modules/sub/HEAD",
		".git/modules/sub/modules/deep/config", ".git/modules/sub/modules/deep/hooks/x", ".git/modules/sub/modules/deep/HEAD",
		"README", "src/config",
	}
	tree := func(t *testing.T) string {
		dir := t.TempDir()
		for _, f := range layout {
			p := filepath.Join(dir, filepath.FromSlash(f))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	left := func(dir string) []string {
		var out []string
		for _, f := range layout {
			if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(f))); err == nil {
				out = append(out, f)
			}
		}
		return out
	}
	for _, modules := range []bool{false, true} {
		want := []string{".git/HEAD", ".git/objects/ab/cdef", ".git/refs/heads/main", ".git/modules/sub/HEAD", ".git/modules/sub/modules/deep/HEAD", "README", "src/config"}
		if !modules {
			want = slices.Insert(want, 3, ".git/modules/sub/config", ".git/modules/sub/hooks/pre-commit")
			want = slices.Insert(want, 6, ".git/modules/sub/modules/deep/config", ".git/modules/sub/modules/deep/hooks/x")
		}
		here := tree(t)
		if err := removeGitConfigs(here, modules); err != nil {
			t.Fatal(err)
		}
		there := tree(t)
		if out, err := exec.Command("bash", "-c", gitConfigCleanup(there, modules)).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		for name, dir := range map[string]string{"in process": here, "in the environment": there} {
			if got := left(dir); !slices.Equal(got, want) {
				t.Errorf("modules %v, %s: left %v, want %v", modules, name, got, want)
			}
		}
	}
	// A directory without a repository is no error.
	if err := removeGitConfigs(t.TempDir(), true); err != nil {
		t.Error(err)
	}
}
