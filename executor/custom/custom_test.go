package custom

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/executortest"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// TestConformance runs the executor suite with host drivers: the
// environment is the runner's host, so the suite's default hooks look
// into it.
func TestConformance(t *testing.T) {
	executortest.Run(t, executortest.Config{
		NewProvider: func(t *testing.T, dir string) executor.Provider {
			return newRig(t, func(o *Options) { o.Helper = "" }).shared().p
		},
	})
}

func TestNewNeedsRunExec(t *testing.T) {
	if _, err := New(Options{}); err == nil || !strings.Contains(err.Error(), "run_exec is required") {
		t.Fatalf("New without run_exec: %v", err)
	}
}

func TestDescribe(t *testing.T) {
	var info runnerapi.Info
	newRig(t).p.Describe(&info)
	if info.Executor != "custom" || info.Shell != "bash" || !info.Features.Variables || !info.Features.Shared ||
		!info.Features.ServiceVariables || info.Features.Image || info.Features.Services {
		t.Fatalf("%+v", info)
	}
}

func TestConfigOutput(t *testing.T) {
	t.Run("EveryField", func(t *testing.T) {
		r := newRig(t)
		b, c := filepath.Join(r.dir, "vm-builds"), filepath.Join(r.dir, "vm-cache")
		r.role("config", `echo 'config says hello' >&2
cat <<EOF
{"builds_dir": "`+b+`", "cache_dir": "`+c+`", "builds_dir_is_shared": true, "hostname": "vm-1",
 "driver": {"name": "test driver", "version": "v1.2"}, "job_env": {"VM_ID": "42", "TMPDIR": "/elsewhere"},
 "shell": "sh", "not_a_key": [1, {"x": null}]}
EOF
exit 0`)
		var out testenv.SyncBuffer
		o := opts(&out)
		o.ConcurrencyID = 3
		o.BuildsDir, o.CacheDir = "/runners/builds", "/runners/cache"
		e, env := r.prepared(o)
		want := executor.Environment{
			BuildDir: b + "/abcdefghi/3/group/project", TmpDir: b + "/abcdefghi/3/group/project.tmp",
			CacheDir: c, Shell: "sh", Helper: "/opt/berth/bin/berth", Hostname: "vm-1",
		}
		if !reflect.DeepEqual(env, want) {
			t.Fatalf("environment\n got %+v\nwant %+v", env, want)
		}
		for _, s := range []string{"config says hello\n", "Using Custom executor with driver test driver v1.2...\n"} {
			if !strings.Contains(out.String(), s) {
				t.Errorf("job log %q lacks %q", out.String(), s)
			}
		}
		r.role("run", `head -n 1 "$script" >"$ctl/shebang"`)
		if _, err := run(e, "step_script", "true"); err != nil {
			t.Fatal(err)
		}
		if err := e.Cleanup(context.Background()); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(r.ctl, "shebang")); string(b) != "#!/usr/bin/env sh\n" {
			t.Errorf("script starts with %q, want the shell of config_exec", b)
		}
		if _, ok := r.env("config")["VM_ID"]; ok {
			t.Error("config_exec got job_env")
		}
		for _, role := range []string{"prepare", "run", "cleanup"} {
			env := r.env(role)
			if env["VM_ID"] != "42" {
				t.Errorf("%s: VM_ID=%q, want job_env's 42", role, env["VM_ID"])
			}
			if env["TMPDIR"] == "/elsewhere" {
				t.Errorf("%s: job_env changed TMPDIR", role)
			}
		}
	})

	for _, tc := range []struct {
		name, config string
		opts         func(*executor.PrepareOptions)
		buildDir     string // relative to the rig's dir
		cacheDir     string
		line         string
		err          string
	}{
		{name: "NotSharedIsGitLabsDefault", config: `{"builds_dir": "DIR/b"}`, buildDir: "b/group/project", cacheDir: "cache", line: "Using Custom executor...\n"},
		{name: "EmptyOutput", config: ``, buildDir: "builds/group/project", cacheDir: "cache"},
		{name: "OnlyWhiteSpace", config: "\n  \n", buildDir: "builds/group/project", cacheDir: "cache"},
		{name: "Null", config: `null`, buildDir: "builds/group/project", cacheDir: "cache"},
		{name: "DriverWithoutVersion", config: `{"driver": {"name": "solo"}}`, buildDir: "builds/group/project", cacheDir: "cache", line: "Using Custom executor with driver solo...\n"},
		{
			name: "RunnersDirsWinOverDefaults", config: `{"builds_dir_is_shared": false}`,
			opts:     func(o *executor.PrepareOptions) { o.BuildsDir, o.CacheDir = "DIR/rb", "DIR/rc" },
			buildDir: "rb/group/project", cacheDir: "rc",
		},
		{
			name: "ConfigWinsOverRunners", config: `{"builds_dir": "DIR/cb", "cache_dir": "DIR/cc"}`,
			opts:     func(o *executor.PrepareOptions) { o.BuildsDir, o.CacheDir = "DIR/rb", "DIR/rc" },
			buildDir: "cb/group/project", cacheDir: "cc",
		},
		{name: "InvalidJSON", config: `{"builds_dir": `, err: "parsing config_exec output: unexpected end of JSON input"},
		{name: "NotAnObject", config: `["builds_dir"]`, err: "parsing config_exec output: want one JSON object"},
		{name: "TrailingGarbage", config: `{} {}`, err: "parsing config_exec output"},
		{name: "WrongType", config: `{"builds_dir_is_shared": "yes"}`, err: "parsing config_exec output"},
		{name: "BadJobEnvKey", config: `{"job_env": {"A=B": "x"}}`, err: `job_env key "A=B"`},
		{name: "RelativeBuildsDir", config: `{"builds_dir": "builds"}`, err: `builds_dir "builds": must be an absolute path`},
		{name: "UnsupportedShell", config: `{"shell": "pwsh"}`, err: `shell "pwsh" is not supported`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			r.role("config", "cat <<'EOF'\n"+strings.ReplaceAll(tc.config, "DIR", r.dir)+"\nEOF\nexit 0\n")
			var out testenv.SyncBuffer
			o := opts(&out)
			if tc.opts != nil {
				tc.opts(&o)
				o.BuildsDir = strings.ReplaceAll(o.BuildsDir, "DIR", r.dir)
				o.CacheDir = strings.ReplaceAll(o.CacheDir, "DIR", r.dir)
			}
			e, _ := r.p.Create(context.Background())
			env, err := e.Prepare(context.Background(), o)
			cerr := e.Cleanup(context.Background())
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Prepare: %v, want an error with %q", err, tc.err)
				}
				if r.roles() != "config cleanup" {
					t.Errorf("calls %q, want config (not retried), then cleanup", r.roles())
				}
				return
			}
			if err != nil || cerr != nil {
				t.Fatalf("Prepare: %v, Cleanup: %v", err, cerr)
			}
			if env.BuildDir != filepath.Join(r.dir, tc.buildDir) || env.CacheDir != filepath.Join(r.dir, tc.cacheDir) {
				t.Errorf("build dir %s, cache dir %s; want %s, %s under %s", env.BuildDir, env.CacheDir, tc.buildDir, tc.cacheDir, r.dir)
			}
			if tc.line != "" && !strings.Contains(out.String(), tc.line) {
				t.Errorf("job log %q lacks %q", out.String(), tc.line)
			}
		})
	}

	t.Run("DirsRequired", func(t *testing.T) {
		r := newRig(t, func(o *Options) { o.BuildsDir, o.CacheDir = "", "" })
		r.role("config", `echo '{"builds_dir": "/b"}'; exit 0`)
		e, _ := r.p.Create(context.Background())
		defer e.Cleanup(context.Background())
		_, err := e.Prepare(context.Background(), opts(nil))
		if err == nil || !strings.Contains(err.Error(), `the cache_dir is not configured: set [[runners]] cache_dir or print "cache_dir" from config_exec`) {
			t.Fatalf("Prepare without cache_dir: %v", err)
		}
	})
}

func TestBuildFailure(t *testing.T) {
	for _, tc := range []struct {
		name, run string
		code      int    // the ExitError's code
		err       string // or a system error's text
	}{
		{name: "ScriptsCode", run: ``, code: 42},
		{name: "WithoutFile", run: `exit "$BUILD_FAILURE_EXIT_CODE"`, code: 1},
		{name: "FirstLineOnly", run: `printf ' 7 \nignored\n' >"$BUILD_EXIT_CODE_FILE"; exit 1`, code: 7},
		{name: "NotAnInteger", run: `echo abc >"$BUILD_EXIT_CODE_FILE"; exit 1`, err: `BUILD_EXIT_CODE_FILE ` + `.*` + `: first line "abc" is not an exit code`},
		{name: "EmptyFile", run: `: >"$BUILD_EXIT_CODE_FILE"; exit 1`, err: `first line "" is not an exit code`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			e, _ := r.prepared(opts(nil))
			r.role("run", tc.run)
			_, err := run(e, executor.StageStepScript, "exit 42")
			var ee *executor.ExitError
			if tc.err != "" {
				if err == nil || errors.As(err, &ee) || !regexp.MustCompile(tc.err).MatchString(err.Error()) {
					t.Fatalf("Run: %v, want a system error matching %q", err, tc.err)
				}
				return
			}
			if !errors.As(err, &ee) || ee.Code != tc.code || ee.Stage != executor.StageStepScript {
				t.Fatalf("Run: %v, want exit code %d of stage step_script", err, tc.code)
			}
		})
	}

	t.Run("StaleFileIgnored", func(t *testing.T) {
		r := newRig(t)
		e, _ := r.prepared(opts(nil))
		if _, err := run(e, "step_a", "exit 42"); err == nil {
			t.Fatal("first stage did not fail")
		}
		r.role("run", `exit 1`)
		_, err := run(e, "step_b", "true")
		var ee *executor.ExitError
		if !errors.As(err, &ee) || ee.Code != 1 {
			t.Fatalf("Run: %v, want exit code 1: the previous stage's file is not this stage's", err)
		}
	})
}

func TestSystemFailure(t *testing.T) {
	t.Run("NotRetriedForScripts", func(t *testing.T) {
		r := newRig(t)
		e, _ := r.prepared(opts(nil))
		r.role("run", `exit "$SYSTEM_FAILURE_EXIT_CODE"`)
		_, err := run(e, executor.StageStepScript, "true")
		var ee *executor.ExitError
		var de *DriverError
		if !errors.Is(err, ErrSystemFailure) || errors.As(err, &ee) || !errors.As(err, &de) || de.Program != "run_exec" {
			t.Fatalf("Run: %v, want a system failure of run_exec", err)
		}
		if n := countLines(r.calls(), "run\t"); n != 1 {
			t.Fatalf("run_exec called %d times", n)
		}
	})

	// Stage attempts (GET_SOURCES_ATTEMPTS, …) are the runner's: one place
	// retries, whatever executor runs the stage.
	t.Run("StagesNotRetriedHere", func(t *testing.T) {
		r := newRig(t)
		o := opts(nil)
		o.Job = &runnerapi.JobResponse{Variables: []runnerapi.Variable{{Key: "GET_SOURCES_ATTEMPTS", Value: "3"}}}
		e, _ := r.prepared(o)
		r.role("run", `exit 2`)
		if _, err := run(e, executor.StageGetSources, "true"); !errors.Is(err, ErrSystemFailure) {
			t.Fatalf("Run: %v", err)
		}
		if n := countLines(r.calls(), "run\t"); n != 1 {
			t.Fatalf("run_exec called %d times, want 1", n)
		}
	})
}

func TestUnknownExitCode(t *testing.T) {
	r := newRig(t)
	e, _ := r.prepared(opts(nil))
	r.role("run", `exit 7`)
	_, err := run(e, executor.StageStepScript, "true")
	var ee *executor.ExitError
	var de *DriverError
	if err == nil || errors.As(err, &ee) || errors.Is(err, ErrSystemFailure) || !errors.As(err, &de) || de.Code != 7 ||
		!strings.Contains(err.Error(), "stage step_script: run_exec ") || !strings.HasSuffix(err.Error(), ": unknown Custom executor executable exit code 7") {
		t.Fatalf("Run: %v", err)
	}
	r.role("run", `kill -KILL $$`)
	_, err = run(e, executor.StageStepScript, "true")
	if !errors.As(err, &de) || de.Code != -1 || de.Signal != syscall.SIGKILL || !strings.Contains(err.Error(), "killed by signal 9") {
		t.Fatalf("Run of a driver killed by a signal: %v", err)
	}
}

func TestPrepareRetries(t *testing.T) {
	for _, tc := range []struct {
		name           string
		config, prep   string
		roles          string // the calls of Prepare and Cleanup
		code           int    // Prepare's ExitError code, or
		systemFailure  bool
		unknown        bool
		retriedMessage bool
	}{
		{name: "SystemFailure", prep: `exit 2`, systemFailure: true, retriedMessage: true,
			roles: "config prepare cleanup config prepare cleanup config prepare cleanup"},
		{name: "SystemFailureOfConfig", config: `exit 2`, systemFailure: true,
			roles: "config cleanup config cleanup config cleanup"},
		{name: "UnknownCode", prep: `exit 9`, unknown: true,
			roles: "config prepare cleanup config prepare cleanup config prepare cleanup"},
		{name: "SucceedsOnThirdAttempt", prep: `echo x >>"$ctl/tries"; [ "$(wc -l <"$ctl/tries")" -ge 3 ] || exit 2`,
			roles: "config prepare cleanup config prepare cleanup config prepare cleanup"},
		{name: "BuildFailure", prep: `exit 1`, code: 1, roles: "config prepare cleanup"},
		{name: "BuildFailureWithCode", prep: `echo 5 >"$BUILD_EXIT_CODE_FILE"; exit 1`, code: 5, roles: "config prepare cleanup"},
		{name: "ConfigsCodeIsNotPreparesCode", config: `echo 5 >"$BUILD_EXIT_CODE_FILE"; exit 0`, prep: `exit 1`, code: 1, roles: "config prepare cleanup"},
		{name: "BuildFailureOfConfig", config: `exit 1`, code: 1, roles: "config cleanup"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			if tc.config != "" {
				r.role("config", tc.config)
			}
			r.role("prepare", tc.prep)
			var out testenv.SyncBuffer
			e, _ := r.p.Create(context.Background())
			_, err := e.Prepare(context.Background(), opts(&out))
			if cerr := e.Cleanup(context.Background()); cerr != nil {
				t.Errorf("Cleanup: %v", cerr)
			}
			var ee *executor.ExitError
			switch {
			case tc.code != 0:
				if !errors.As(err, &ee) || ee.Code != tc.code || ee.Stage != executor.StagePrepareExecutor || !regexp.MustCompile(`^(config|prepare)_exec /`).MatchString(err.Error()) {
					t.Fatalf("Prepare: %v, want a build failure with code %d", err, tc.code)
				}
			case tc.systemFailure:
				if !errors.Is(err, ErrSystemFailure) || errors.As(err, &ee) {
					t.Fatalf("Prepare: %v, want a system failure", err)
				}
			case tc.unknown:
				if err == nil || !strings.Contains(err.Error(), "unknown Custom executor executable exit code 9") {
					t.Fatalf("Prepare: %v", err)
				}
			default:
				if err != nil {
					t.Fatalf("Prepare: %v", err)
				}
			}
			if got := r.roles(); got != tc.roles {
				t.Errorf("calls %q, want %q", got, tc.roles)
			}
			if tc.retriedMessage && (!strings.Contains(out.String(), "WARNING: Preparation failed: prepare_exec ") || !strings.Contains(out.String(), "Will be retried in 0s ...")) {
				t.Errorf("job log %q does not tell about the retries", out.String())
			}
		})
	}
}

func TestArgs(t *testing.T) {
	r := newRig(t)
	e, env := r.prepared(opts(nil))
	r.role("run", `cp "$script" "$ctl/script.$stage"; stat -c %a "$script" >"$ctl/mode.$stage"`)
	for _, stage := range []string{executor.StageGetSources, executor.StageStepScript, "step_release", executor.StageAfterScript, executor.StageCleanupFileVariables} {
		if _, err := run(e, stage, "echo stage "+stage); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	calls := r.calls()
	tmp := r.env("prepare")["TMPDIR"]
	want := []string{"config\tc-arg", "prepare\tp-arg"}
	var scripts []string
	for i, stage := range []string{"get_sources", "build_script", "step_release", "after_script", "cleanup_file_variables"} {
		c := calls[2+i]
		f := strings.Split(c, "\t")
		if len(f) != 4 || !strings.HasPrefix(f[2], tmp+"/script") || !regexp.MustCompile(`/script[0-9]+/script$`).MatchString(f[2]) {
			t.Fatalf("run call %q: want run r-arg <tmp>/script*/script %s", c, stage)
		}
		scripts = append(scripts, f[2])
		want = append(want, "run\tr-arg\t"+f[2]+"\t"+stage)
	}
	want = append(want, "cleanup\tcl-arg")
	if !reflect.DeepEqual(calls, want) {
		t.Fatalf("calls\n%s\nwant\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
	}
	for _, s := range scripts {
		if _, err := os.Stat(s); !os.IsNotExist(err) {
			t.Errorf("script %s survives its stage: %v", s, err)
		}
	}
	for _, stage := range []string{"get_sources", "build_script", "step_release", "after_script", "cleanup_file_variables"} {
		b, err := os.ReadFile(filepath.Join(r.ctl, "script."+stage))
		if err != nil {
			t.Fatal(err)
		}
		inner := "echo stage " + stage
		if stage == "build_script" {
			inner = "echo stage step_script"
		}
		if !strings.HasPrefix(string(b), "#!/usr/bin/env bash\n") || !strings.Contains(string(b), inner) || !strings.Contains(string(b), "cd '"+env.BuildDir+"'") {
			t.Errorf("script of %s:\n%s", stage, b)
		}
		if m, _ := os.ReadFile(filepath.Join(r.ctl, "mode."+stage)); strings.TrimSpace(string(m)) != "700" {
			t.Errorf("script of %s has mode %s, want 700", stage, m)
		}
	}
}

func TestEnvironment(t *testing.T) {
	t.Setenv("BERTH_TEST_RUNNER_ENV", "from-runner")
	r := newRig(t, func(o *Options) {
		o.Env = append(o.Env, "BERTH_TEST_OPTION=from-options", "BUILD_FAILURE_EXIT_CODE=9")
		o.Helper = "/usr/local/bin/berth"
	})
	r.shared()
	r.role("prepare", `cp "$JOB_RESPONSE_FILE" "$ctl/response.json"; pwd >"$ctl/pwd"`)
	job := &runnerapi.JobResponse{
		ID:    77,
		Token: "job-token",
		Variables: []runnerapi.Variable{
			{Key: "CI_JOB_ID", Value: "999"},
			{Key: "CI_PROJECT_DIR", Value: "/evil"},
			{Key: "A", Value: "1"},
			{Key: "B", Value: "$A-x"},
			{Key: "RAW", Value: "$A", Raw: true},
			{Key: "FILEVAR", Value: "content of the file", File: true},
			{Key: "SECRET", Value: "s3cr3t", Masked: true},
			{Key: "PROJ", Value: "$CI_PROJECT_DIR/sub"},
			{Key: "BAD=KEY", Value: "x"},
			{Key: "NUL", Value: "a\x00b"},
		},
		Image: &runnerapi.Image{Name: "registry.test/img:$A"},
		Services: []runnerapi.Image{
			{Name: "postgres:16", Alias: "db, postgres", Entrypoint: []string{"sh", "-c"}, Variables: []runnerapi.Variable{{Key: "P", Value: "$A-p"}}},
			{Name: "redis", Command: []string{"redis-server"}},
		},
	}
	o := opts(nil)
	o.Job = job
	e, env := r.prepared(o)
	if _, err := run(e, executor.StageStepScript, "true"); err != nil {
		t.Fatal(err)
	}
	if err := e.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}

	wantServices := `[{"name":"postgres:16","alias":"db","entrypoint":["sh","-c"],"command":null,"variables":{"P":"1-p"}},` +
		`{"name":"redis","alias":"","entrypoint":null,"command":["redis-server"]}]`
	tmp := r.env("config")["TMPDIR"]
	if !strings.HasPrefix(filepath.Base(tmp), "custom-executor") {
		t.Fatalf("TMPDIR %q, want a custom-executor* directory", tmp)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("the job's temporary directory %s survives Cleanup", tmp)
	}
	markers := map[string]string{}
	for _, role := range []string{"config", "prepare", "run", "cleanup"} {
		got := r.env(role)
		want := map[string]string{
			"BERTH_TEST_RUNNER_ENV":               "from-runner",
			"BERTH_TEST_OPTION":                   "from-options",
			"TMPDIR":                              tmp,
			"BUILD_FAILURE_EXIT_CODE":             "1",
			"SYSTEM_FAILURE_EXIT_CODE":            "2",
			"BUILD_EXIT_CODE_FILE":                tmp + "/build_exit_code",
			"JOB_RESPONSE_FILE":                   tmp + "/response.json",
			"BERTH_HELPER":                        "/usr/local/bin/berth",
			"CUSTOM_ENV_CI_JOB_ID":                "77",
			"CUSTOM_ENV_CI_CONCURRENT_ID":         "0",
			"CUSTOM_ENV_CI_CONCURRENT_PROJECT_ID": "0",
			"CUSTOM_ENV_CI_RUNNER_SHORT_TOKEN":    "abcdefghi",
			"CUSTOM_ENV_A":                        "1",
			"CUSTOM_ENV_B":                        "1-x",
			"CUSTOM_ENV_RAW":                      "$A",
			"CUSTOM_ENV_FILEVAR":                  "content of the file",
			"CUSTOM_ENV_SECRET":                   "s3cr3t",
			"CUSTOM_ENV_CI_JOB_IMAGE":             "registry.test/img:1",
			"CUSTOM_ENV_CI_JOB_SERVICES":          wantServices,
		}
		// PROJ expands as in the job's scripts, where the job's own
		// CI_PROJECT_DIR wins; the driver's CI_PROJECT_DIR is the fact.
		if role == "config" {
			want["CUSTOM_ENV_PROJ"] = "/sub"
		} else {
			want["CUSTOM_ENV_CI_PROJECT_DIR"] = env.BuildDir
			want["CUSTOM_ENV_CI_BUILDS_DIR"] = filepath.Join(r.dir, "builds", "abcdefghi", "0")
			want["CUSTOM_ENV_PROJ"] = "/evil/sub"
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %s=%q, want %q", role, k, got[k], v)
			}
		}
		if role == "config" {
			if _, ok := got["CUSTOM_ENV_CI_PROJECT_DIR"]; ok {
				t.Errorf("config_exec got CI_PROJECT_DIR before the environment is known")
			}
		}
		for _, k := range []string{"CUSTOM_ENV_BAD=KEY", "CUSTOM_ENV_BAD", "CUSTOM_ENV_NUL"} {
			if _, ok := got[k]; ok {
				t.Errorf("%s: %s is set", role, k)
			}
		}
		m := got["BERTH_STAGE_MARKER"]
		if !strings.HasPrefix(m, "s_customtest.abcdefghi.") {
			t.Errorf("%s: BERTH_STAGE_MARKER=%q, want a marker of the runner's scope", role, m)
		}
		markers[role] = m
	}
	if markers["config"] != markers["prepare"] || markers["prepare"] != markers["cleanup"] || markers["run"] == markers["prepare"] {
		t.Errorf("markers %v: want one for the job's config, prepare and cleanup and its own for each stage", markers)
	}
	if b, _ := os.ReadFile(filepath.Join(r.ctl, "pwd")); strings.TrimSpace(string(b)) != tmp {
		t.Errorf("prepare_exec ran in %q, want the job's temporary directory", b)
	}
	var gotJob, wantJob any
	b, err := os.ReadFile(filepath.Join(r.ctl, "response.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &gotJob); err != nil {
		t.Fatal(err)
	}
	wb, _ := json.Marshal(job)
	_ = json.Unmarshal(wb, &wantJob)
	if !reflect.DeepEqual(gotJob, wantJob) {
		t.Errorf("JOB_RESPONSE_FILE\n%s\nwant\n%s", b, wb)
	}

	t.Run("NoServices", func(t *testing.T) {
		r := newRig(t)
		r.prepared(opts(nil))
		if v, ok := r.env("prepare")["CUSTOM_ENV_CI_JOB_SERVICES"]; !ok || v != "" {
			t.Fatalf("CUSTOM_ENV_CI_JOB_SERVICES=%q (set: %v), want set and empty", v, ok)
		}
	})
}

func TestTimeouts(t *testing.T) {
	secs := func(n int) *int { return &n }
	t.Run("PrepareTimesOutAndIsRetried", func(t *testing.T) {
		r := newRig(t, func(o *Options) { o.Config.PrepareExecTimeout = secs(1) })
		// The first attempt ignores SIGTERM until SIGKILL comes.
		r.role("prepare", `if [ ! -e "$ctl/hung" ]; then
	touch "$ctl/hung"
	trap '' TERM
	echo $$ >"$ctl/pid"
	while :; do sleep 0.1; done
fi`)
		var out testenv.SyncBuffer
		r.prepared(opts(&out))
		if !strings.Contains(out.String(), "prepare_exec_timeout (1s) exceeded") {
			t.Errorf("job log %q does not name the timeout", out.String())
		}
		if r.roles() != "config prepare cleanup config prepare" {
			t.Errorf("calls %q", r.roles())
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(must(os.ReadFile(filepath.Join(r.ctl, "pid"))))))
		if pid == 0 || syscall.Kill(pid, 0) == nil {
			t.Errorf("the hung prepare_exec (%d) still runs", pid)
		}
	})

	t.Run("ConfigTimesOut", func(t *testing.T) {
		r := newRig(t, func(o *Options) { o.Config.ConfigExecTimeout = secs(1) })
		r.role("config", `trap 'echo TERM >>"$ctl/signals"; exit 0' TERM; while :; do sleep 0.1; done`)
		e, _ := r.p.Create(context.Background())
		_, err := e.Prepare(context.Background(), opts(nil))
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "config_exec_timeout (1s) exceeded") {
			t.Fatalf("Prepare: %v", err)
		}
		if err := e.Cleanup(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := readLines(t, filepath.Join(r.ctl, "signals")); len(got) != 3 {
			t.Errorf("config_exec got %v, want SIGTERM in each of 3 attempts", got)
		}
	})

	t.Run("CleanupTimesOut", func(t *testing.T) {
		r := newRig(t, func(o *Options) { o.Config.CleanupExecTimeout = secs(1) })
		r.role("cleanup", `trap 'exit 0' TERM; while :; do sleep 0.1; done`)
		e, _ := r.prepared(opts(nil))
		err := e.Cleanup(context.Background())
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "cleanup_exec_timeout (1s) exceeded") {
			t.Fatalf("Cleanup: %v", err)
		}
		if err := e.Cleanup(context.Background()); err != nil {
			t.Fatalf("second Cleanup: %v", err)
		}
	})

	t.Run("CancelTerminatesGracefully", func(t *testing.T) {
		r := newRig(t, func(o *Options) { o.Config.GracefulKillTimeout = secs(600) })
		e, _ := r.prepared(opts(nil))
		r.role("run", `trap 'echo TERM >>"$ctl/signals"; exit 0' TERM; echo started; while :; do sleep 0.1; done`)
		why := errors.New("job canceled by the test")
		ctx, cancel := context.WithCancelCause(context.Background())
		var out testenv.SyncBuffer
		done := make(chan error, 1)
		go func() {
			done <- e.Run(ctx, executor.Command{Stage: executor.StageStepScript, Script: "true", Output: &out})
		}()
		waitFor(t, func() bool { return strings.Contains(out.String(), "started") })
		cancel(why)
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) || !errors.Is(err, why) {
				t.Fatalf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return after SIGTERM ended the driver (graceful_kill_timeout is 600 s)")
		}
		if got := readLines(t, filepath.Join(r.ctl, "signals")); !reflect.DeepEqual(got, []string{"TERM"}) {
			t.Errorf("driver got %v, want SIGTERM", got)
		}
		r.role("run", "") // Cleanup's run_exec, which removes TmpDir, must not hang
	})

	t.Run("CancelKillsAfterGracefulTimeout", func(t *testing.T) {
		r := newRig(t)
		e, _ := r.prepared(opts(nil))
		r.role("run", `trap '' TERM; echo $$ >"$ctl/pid"; echo started; while :; do sleep 0.1; done`)
		ctx, cancel := context.WithCancel(context.Background())
		var out testenv.SyncBuffer
		done := make(chan error, 1)
		go func() {
			done <- e.Run(ctx, executor.Command{Stage: executor.StageStepScript, Script: "true", Output: &out})
		}()
		waitFor(t, func() bool { return strings.Contains(out.String(), "started") })
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return")
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(must(os.ReadFile(filepath.Join(r.ctl, "pid"))))))
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("driver %d ignoring SIGTERM survives", pid)
		}
		r.role("run", "")
	})
}

// fakeProcess records the signals stop sends and exits on the one it is
// told to (0: never).
type fakeProcess struct {
	sigs    []syscall.Signal
	exitOn  syscall.Signal
	termErr error
	exited  chan struct{}
}

func (p *fakeProcess) signal(sig syscall.Signal) error {
	p.sigs = append(p.sigs, sig)
	if sig == syscall.SIGTERM && p.termErr != nil {
		return p.termErr
	}
	if sig == p.exitOn {
		close(p.exited)
	}
	return nil
}

func TestStopSequence(t *testing.T) {
	const long = time.Hour
	for _, tc := range []struct {
		name            string
		exitOn          syscall.Signal
		termErr         error
		graceful, force time.Duration
		sigs            []syscall.Signal
		abandoned       bool
	}{
		{name: "ExitsOnTerm", exitOn: syscall.SIGTERM, graceful: long, force: long, sigs: []syscall.Signal{syscall.SIGTERM}},
		{name: "ExitsOnKill", exitOn: syscall.SIGKILL, graceful: time.Millisecond, force: long, sigs: []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}},
		{name: "NeverExits", graceful: time.Millisecond, force: time.Millisecond, sigs: []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}, abandoned: true},
		{name: "TermFailsKillAtOnce", exitOn: syscall.SIGKILL, termErr: syscall.EPERM, graceful: long, force: long, sigs: []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &fakeProcess{exitOn: tc.exitOn, termErr: tc.termErr, exited: make(chan struct{})}
			done := make(chan bool, 1)
			go func() { done <- stop(p, p.exited, tc.graceful, tc.force) }()
			select {
			case abandoned := <-done:
				if abandoned != tc.abandoned || !reflect.DeepEqual(p.sigs, tc.sigs) {
					t.Fatalf("abandoned %v after %v, want %v after %v", abandoned, p.sigs, tc.abandoned, tc.sigs)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("stop waits although it need not (signals %v)", p.sigs)
			}
		})
	}
}

func TestCleanup(t *testing.T) {
	t.Run("OutputToRunnerLog", func(t *testing.T) {
		r := newRig(t)
		r.role("cleanup", `echo removed the vm; echo could not remove the disk >&2`)
		e, _ := r.prepared(opts(nil))
		if err := e.Cleanup(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !r.log.has("DEBUG cleanup_exec", "cleanup_std=out", "line=removed the vm") ||
			!r.log.has("WARN cleanup_exec", "cleanup_std=err", "line=could not remove the disk") {
			t.Fatalf("runner log:\n%s", r.log)
		}
	})

	t.Run("Failure", func(t *testing.T) {
		r := newRig(t)
		r.role("cleanup", `exit 5`)
		e, _ := r.prepared(opts(nil))
		err := e.Cleanup(context.Background())
		var de *DriverError
		if !errors.As(err, &de) || de.Program != "cleanup_exec" || de.Code != 5 {
			t.Fatalf("Cleanup: %v", err)
		}
		if err := e.Cleanup(context.Background()); err != nil {
			t.Fatalf("second Cleanup: %v", err)
		}
		if r.roles() != "config prepare cleanup" {
			t.Fatalf("calls %q", r.roles())
		}
	})

	t.Run("NotCalledWithoutDriverCalls", func(t *testing.T) {
		r := newRig(t)
		e, _ := r.p.Create(context.Background())
		if err := e.Cleanup(context.Background()); err != nil {
			t.Fatal(err)
		}
		e, _ = r.p.Create(context.Background())
		o := opts(nil)
		o.ProjectPath = "../x"
		if _, err := e.Prepare(context.Background(), o); err == nil {
			t.Fatal("Prepare accepted ../x")
		}
		if err := e.Cleanup(context.Background()); err != nil {
			t.Fatal(err)
		}
		if r.roles() != "" {
			t.Fatalf("calls %q, want none", r.roles())
		}
	})

	t.Run("CalledAfterCanceledPrepare", func(t *testing.T) {
		r := newRig(t)
		r.role("prepare", `echo started; while :; do sleep 0.1; done`)
		e, _ := r.p.Create(context.Background())
		ctx, cancel := context.WithCancel(context.Background())
		var out testenv.SyncBuffer
		go func() {
			waitFor(t, func() bool { return strings.Contains(out.String(), "started") })
			cancel()
		}()
		if _, err := e.Prepare(ctx, opts(&out)); !errors.Is(err, context.Canceled) {
			t.Fatalf("Prepare: %v", err)
		}
		if err := e.Cleanup(context.Background()); err != nil {
			t.Fatal(err)
		}
		if r.roles() != "config prepare cleanup" {
			t.Fatalf("calls %q: a canceled preparation is not retried, and is cleaned up", r.roles())
		}
	})

	t.Run("TmpDirRemovedInTheEnvironment", func(t *testing.T) {
		r := newRig(t)
		e, env := r.prepared(opts(nil))
		if err := os.MkdirAll(env.TmpDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(env.TmpDir, "stale"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := run(e, executor.StagePrepareScript, "true"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(env.TmpDir, "stale")); !os.IsNotExist(err) {
			t.Fatalf("the first stage left a previous job's file in TmpDir: %v", err)
		}
		if _, err := run(e, executor.StageStepScript, `echo x > "$0.var"; echo secret > `+shq(env.TmpDir+"/FILE_VAR")); err != nil {
			t.Fatal(err)
		}
		if _, err := run(e, executor.StageAfterScript, `test -e `+shq(env.TmpDir+"/FILE_VAR")); err != nil {
			t.Fatalf("later stages must not empty TmpDir: %v", err)
		}
		if err := e.Cleanup(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(env.TmpDir); !os.IsNotExist(err) {
			t.Fatalf("TmpDir survives Cleanup: %v", err)
		}
		if got := r.calls(); !strings.HasSuffix(got[len(got)-2], "\tcleanup_file_variables") || got[len(got)-1] != "cleanup\tcl-arg" {
			t.Fatalf("calls %q: want run_exec cleanup_file_variables, then cleanup_exec", got)
		}
	})

	t.Run("TmpDirRemovedByTheLastStage", func(t *testing.T) {
		r := newRig(t)
		e, env := r.prepared(opts(nil))
		if _, err := run(e, executor.StageStepScript, "true"); err != nil {
			t.Fatal(err)
		}
		if _, err := run(e, executor.StageCleanupFileVariables, "rm -rf file-variables"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(env.TmpDir); !os.IsNotExist(err) {
			t.Fatalf("TmpDir survives the cleanup_file_variables stage: %v", err)
		}
		if err := e.Cleanup(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := countLines(r.calls(), "run\t"); n != 2 {
			t.Fatalf("run_exec called %d times, want 2: Cleanup needs no run_exec of its own", n)
		}
	})

	t.Run("DaemonsOfPrepareLiveUntilCleanup", func(t *testing.T) {
		r := newRig(t)
		r.role("prepare", `setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! >"$ctl/daemon"`)
		e, _ := r.prepared(opts(nil))
		pid, _ := strconv.Atoi(strings.TrimSpace(string(must(os.ReadFile(filepath.Join(r.ctl, "daemon"))))))
		if _, err := run(e, executor.StageStepScript, "true"); err != nil {
			t.Fatal(err)
		}
		if !alive(pid) {
			t.Fatal("a process prepare_exec started for the job was killed before Cleanup")
		}
		if err := e.Cleanup(context.Background()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return !alive(pid) })
	})
}

func TestSweep(t *testing.T) {
	r := newRig(t)
	r.role("prepare", `setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! >"$ctl/daemon"`)
	r.prepared(opts(nil))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(must(os.ReadFile(filepath.Join(r.ctl, "daemon"))))))
	// Another runner's processes are not this runner's leftovers.
	if err := r.p.Sweep(context.Background(), executor.SweepOptions{SystemID: "s_customtest", ShortToken: "zyxwvutsr"}); err != nil {
		t.Fatal(err)
	}
	if !alive(pid) {
		t.Fatal("Sweep of another runner killed this runner's process")
	}
	// As if the runner manager had died: no Cleanup, a new manager sweeps.
	if err := r.p.Sweep(context.Background(), executor.SweepOptions{SystemID: "s_customtest", ShortToken: "abcdefghi"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !alive(pid) })
	if !r.log.has("WARN killed driver processes left by a previous runner manager", "runner=abcdefghi") {
		t.Errorf("runner log:\n%s", r.log)
	}
}

// alive reports whether pid runs and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestStageScript(t *testing.T) {
	env := executor.Environment{BuildDir: "/b/it's", TmpDir: "/b/it's.tmp", Shell: "sh"}
	got := stageScript(env, "echo 'hi'", true, true)
	want := `#!/usr/bin/env sh
# Generated by berth's custom executor: one stage of a job.
rm -rf -- '/b/it'\''s.tmp'
mkdir -p -- '/b/it'\''s' '/b/it'\''s.tmp' && chmod 700 '/b/it'\''s.tmp' && cd '/b/it'\''s' || exit 1
( eval 'echo '\''hi'\''' ) </dev/null
rc=$?
rm -rf -- '/b/it'\''s.tmp'
exit $rc
`
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

func TestStageScriptReadFromStdin(t *testing.T) {
	// A driver may feed the script to the shell's stdin; a command of the
	// stage that reads stdin must not eat the rest of it.
	dir := t.TempDir()
	env := executor.Environment{BuildDir: dir + "/build", TmpDir: dir + "/build.tmp", Shell: "sh"}
	script := stageScript(env, "cat\necho after-cat\nexit 3", true, false)
	f := filepath.Join(dir, "script")
	if err := os.WriteFile(f, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	in, _ := os.Open(f)
	defer in.Close()
	cmd := exec.Command("sh", "-s")
	cmd.Stdin = in
	out, err := cmd.CombinedOutput()
	var code int
	if ee, ok := err.(interface{ ExitCode() int }); ok {
		code = ee.ExitCode()
	}
	if !strings.Contains(string(out), "after-cat") || code != 3 {
		t.Fatalf("output %q, exit %d (%v)", out, code, err)
	}
}

func FuzzParseConfigOutput(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `null`, `{"builds_dir": "/b", "builds_dir_is_shared": true, "driver": {"name": "x"}}`,
		`{"job_env": {"A": "1"}}`, `{"job_env": {"=": "1"}}`, `[1]`, `{"shell": 1}`, "{\"job_env\": {\"A\": \"\\u0000\"}}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseConfigOutput(b)
		if err != nil {
			return
		}
		for k, v := range c.JobEnv {
			if !validEnvKey(k) || strings.ContainsRune(v, 0) {
				t.Fatalf("accepted job_env %q=%q", k, v)
			}
		}
		_ = c.startupLine()
	})
}
