// Package custom is GitLab's custom executor: the environment of a job is
// made, used and removed by four programs of the user's, the driver
// ([runners.custom] config_exec, prepare_exec, run_exec, cleanup_exec),
// which Berth calls exactly as gitlab-runner does, so drivers written for
// gitlab-runner (LXD, libvirt, Podman, …) run unchanged.
//
// # Calls
//
//	Prepare ──► config_exec  config_args…                 stdout: ConfigOutput JSON, stderr: job log
//	        ──► prepare_exec prepare_args…                stdout+stderr: job log
//	            (a driver failure: cleanup_exec, wait, config_exec and prepare_exec again; 3 attempts)
//	Run     ──► run_exec     run_args… <script> <stage>    stdout+stderr: job log   (once per stage)
//	Cleanup ──► run_exec     run_args… <script> cleanup_file_variables   (only when TmpDir is left)
//	        ──► cleanup_exec cleanup_args…                stdout: runner log (debug), stderr: (warn)
//
// Every call but run_exec is optional. cleanup_exec runs whenever Prepare
// got as far as calling the driver, also after a failed or canceled
// config_exec or prepare_exec. Each call runs in its own process group,
// in the job's temporary directory on the runner's host, with:
//
//   - the runner's own environment and Options.Env;
//   - job_env of config_exec (plain names; prepare, run and cleanup only);
//   - CUSTOM_ENV_<KEY> for every job variable (values expanded unless
//     raw), CUSTOM_ENV_CI_JOB_IMAGE, CUSTOM_ENV_CI_JOB_SERVICES (JSON, ""
//     without services), and facts the job cannot override: CI_JOB_ID,
//     CI_CONCURRENT_ID, CI_CONCURRENT_PROJECT_ID, CI_RUNNER_SHORT_TOKEN and,
//     from prepare_exec on, CI_BUILDS_DIR and CI_PROJECT_DIR;
//   - TMPDIR (the job's temporary directory, custom-executor*),
//     BUILD_FAILURE_EXIT_CODE=1, SYSTEM_FAILURE_EXIT_CODE=2,
//     BUILD_EXIT_CODE_FILE (<tmp>/build_exit_code, removed before each
//     run_exec), JOB_RESPONSE_FILE (<tmp>/response.json, the job payload);
//   - BERTH_HELPER, the berth binary on the runner's host, and
//     BERTH_STAGE_MARKER (package reap), both Berth's additions.
//
// # Exit codes
//
// 0 is success. BUILD_FAILURE_EXIT_CODE is a script failure: an
// *executor.ExitError whose code is the first line of BUILD_EXIT_CODE_FILE
// when the driver wrote it (a line that is no integer is a system
// failure), else 1; from config_exec or prepare_exec it fails Prepare the
// same way (script_failure, not retried). SYSTEM_FAILURE_EXIT_CODE is a
// system failure (*DriverError matching ErrSystemFailure). Any other code
// is "unknown Custom executor executable exit code N", a system failure.
// The runner, not the executor, runs get_sources, restore_cache and
// download_artifacts again per GET_SOURCES_ATTEMPTS and its siblings,
// after a failure of either kind.
//
// # Timeouts
//
// config_exec, prepare_exec and cleanup_exec are bounded by their
// *_exec_timeout (default one hour) and by the context of the call;
// run_exec by the context only (the job's timeout and cancel). A call
// whose bound is reached gets one SIGTERM on its process group, then after
// graceful_kill_timeout SIGKILL (for run_exec also on the stage's marked
// processes), then after force_kill_timeout it is abandoned; the call's
// error wraps the context's error and cause.
//
// # The environment
//
// Environment paths are paths inside the driver's environment (POSIX):
//
//   - BuildDir is <builds_dir>/<project path> as GitLab makes it, or, when
//     config_exec says builds_dir_is_shared (several jobs' environments
//     see the same builds_dir), <builds_dir>/<short token>/<concurrency
//     id>/<project path>. builds_dir and cache_dir come from config_exec,
//     else from [[runners]] (PrepareOptions), else from Options; one of
//     them must say, and the paths must be absolute.
//   - TmpDir is <BuildDir>.tmp (GitLab's temporary project directory):
//     inside the environment, next to the build directory. The stage
//     scripts create it (mode 0700; the first stage of a job empties it);
//     the cleanup_file_variables stage's script removes it; when that
//     stage did not run or failed, Cleanup calls run_exec once more, as
//     stage cleanup_file_variables, with a script that removes it.
//   - Shell is config_exec's shell, else [[runners]] shell, else bash;
//     bash and sh are supported (the runner's scripts are POSIX).
//   - Helper is Options.Helper (default: this berth binary). The driver
//     makes that file available at the same path inside its environment;
//     it finds it in BERTH_HELPER.
//   - Hostname is config_exec's hostname ("" without).
//
// The script run_exec gets (<tmp>/script<random>/script, mode 0700, no
// extension as GitLab names bash and sh scripts) is complete: a
// "#!/usr/bin/env <shell>" line, then it creates and enters BuildDir and
// runs the stage in a subshell with stdin from /dev/null, so a driver may
// run it as a file or feed it to the shell's stdin ("bash -s < script").
//
// # Processes
//
// When a run_exec call ends, its process group and every process on the
// runner's host that carries its BERTH_STAGE_MARKER are killed. Processes
// config_exec and prepare_exec start may run until the end of the job: they
// carry the job's marker and are killed after cleanup_exec. A driver that
// starts processes elsewhere (a container, a VM) stops them itself: on
// SIGTERM and when the stage's script ends.
package custom

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/internal/reap"
	"github.com/berthci/berth/runnerapi"
)

// Name is the executor's name in config.toml.
const Name = "custom"

// Options configure the custom executor provider of one [[runners]] entry.
type Options struct {
	// Config is [runners.custom]; run_exec is required.
	Config config.Custom
	// BuildsDir and CacheDir are used when neither config_exec nor
	// [[runners]] sets builds_dir / cache_dir.
	BuildsDir, CacheDir string
	// Helper is the berth binary jobs run as "<Helper> helper …" (empty:
	// os.Executable()).
	Helper string
	// Env is added to the runner's own environment for every driver call.
	Env []string
	// PrepareRetryDelay is the pause between attempts of a preparation
	// that failed with a system failure (0: 3 s, GitLab's; negative:
	// none).
	PrepareRetryDelay time.Duration
	Logger            *slog.Logger
}

// prepareAttempts is how often a preparation that fails with a system
// failure is attempted, as GitLab.
const prepareAttempts = 3

// Provider creates custom executors.
type Provider struct {
	o        Options
	helper   string
	timeouts timeouts
}

// timeouts are [runners.custom]'s timeouts with their defaults.
type timeouts struct {
	config, prepare, cleanup time.Duration
	graceful, force          time.Duration
}

// New returns a Provider for o.
func New(o Options) (*Provider, error) {
	if o.Config.RunExec == "" {
		return nil, fmt.Errorf("custom executor: run_exec is required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case o.PrepareRetryDelay == 0:
		o.PrepareRetryDelay = 3 * time.Second
	case o.PrepareRetryDelay < 0:
		o.PrepareRetryDelay = 0
	}
	helper := o.Helper
	if helper == "" {
		var err error
		if helper, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("custom executor: finding the berth binary for the helper: %w", err)
		}
	}
	c := o.Config
	return &Provider{o: o, helper: helper, timeouts: timeouts{
		config:   config.Seconds(c.ConfigExecTimeout, config.DefaultCustomExecTimeout),
		prepare:  config.Seconds(c.PrepareExecTimeout, config.DefaultCustomExecTimeout),
		cleanup:  config.Seconds(c.CleanupExecTimeout, config.DefaultCustomExecTimeout),
		graceful: config.Seconds(c.GracefulKillTimeout, config.DefaultGracefulKillTimeout),
		force:    config.Seconds(c.ForceKillTimeout, config.DefaultForceKillTimeout),
	}}, nil
}

// Create implements executor.Provider.
func (p *Provider) Create(ctx context.Context) (executor.Executor, error) {
	return &Executor{p: p, log: p.o.Logger}, nil
}

// Describe implements executor.Describer. Image and services are the
// driver's business (it gets CI_JOB_IMAGE and CI_JOB_SERVICES); Berth
// advertises what gitlab-runner advertises for the custom executor plus
// what Berth's runner does in any environment.
func (p *Provider) Describe(info *runnerapi.Info) {
	info.Executor = Name
	info.Shell = "bash"
	f := &info.Features
	executor.RunnerFeatures(f)
	f.Shared = true
	f.ServiceVariables = true
}

// Sweep implements executor.Sweeper: it kills every process on the
// runner's host that a driver call of this runner started and that
// outlived a runner manager killed without a chance to clean up. What
// drivers made elsewhere (containers, VMs) is theirs to find: Berth cannot
// call cleanup_exec for a job it no longer knows.
func (p *Provider) Sweep(ctx context.Context, o executor.SweepOptions) error {
	scope := markerScope(o.SystemID, o.ShortToken)
	if scope == "" {
		return nil
	}
	n, err := reap.SignalScope(scope, syscall.SIGKILL)
	if err != nil {
		return fmt.Errorf("sweeping processes of runner %s: %w", o.ShortToken, err)
	}
	if n > 0 {
		p.o.Logger.Warn("killed driver processes left by a previous runner manager", "runner", o.ShortToken, "processes", n)
	}
	return nil
}

// markerScope is the scope of a runner's markers ("" without a system
// id), the shell executor's format.
func markerScope(systemID, shortToken string) string {
	if systemID == "" || shortToken == "" {
		return ""
	}
	return executor.SafeName(systemID) + "." + executor.SafeName(shortToken)
}
