package custom

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/internal/reap"
	"github.com/berthci/berth/runnerapi"
)

type state int

const (
	created state = iota
	prepared
	failed
	cleaned
)

func (s state) String() string {
	return [...]string{"created", "prepared", "failed", "cleaned"}[s]
}

// Executor is one job's custom executor.
type Executor struct {
	p   *Provider
	log *slog.Logger

	// mu guards state and sess; Prepare holds it throughout.
	mu    sync.Mutex
	state state
	// sess is set once Prepare has made the job's temporary directory:
	// from then on Cleanup calls cleanup_exec.
	sess *session

	gmu sync.Mutex
	// groups are the running driver programs, killed by Cleanup.
	groups map[int]group
}

// session is one job's dealings with the driver.
type session struct {
	opts    executor.PrepareOptions
	job     *runnerapi.JobResponse
	project string // slash-separated, checked

	hostTmp      string // the job's temporary directory on the runner's host
	responseFile string
	exitCodeFile string
	scope        string // markers' scope (Sweep)
	jobMarker    string // marker of config_exec, prepare_exec, cleanup_exec

	// What the last config_exec said and what follows from it.
	cfg    ConfigOutput
	env    executor.Environment
	vars   variables
	custom []string // CUSTOM_ENV_* entries

	// ran: a stage ran (the job's TmpDir was emptied and created);
	// tmpGone: the last stage removed TmpDir. Guarded by Executor.mu.
	ran, tmpGone bool
}

// Prepare implements executor.Executor.
func (e *Executor) Prepare(ctx context.Context, opts executor.PrepareOptions) (executor.Environment, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state != created {
		return executor.Environment{}, fmt.Errorf("prepare: executor already %s", e.state)
	}
	env, err := e.prepare(ctx, opts)
	if err != nil {
		e.state = failed
		return executor.Environment{}, err
	}
	e.state = prepared
	return env, nil
}

func (e *Executor) prepare(ctx context.Context, opts executor.PrepareOptions) (executor.Environment, error) {
	if err := ctx.Err(); err != nil {
		return executor.Environment{}, stopped("preparing custom executor", ctx)
	}
	project, err := executor.CleanProjectPath(opts.ProjectPath)
	if err != nil {
		return executor.Environment{}, err
	}
	if s := opts.ShortToken; s == "" || strings.ContainsAny(s, `/\`) || s == "." || s == ".." {
		return executor.Environment{}, fmt.Errorf("short token %q: not usable in a path", s)
	}
	if opts.ConcurrencyID < 0 {
		return executor.Environment{}, fmt.Errorf("concurrency id %d: must not be negative", opts.ConcurrencyID)
	}
	job := opts.Job
	if job == nil {
		job = &runnerapi.JobResponse{ID: opts.JobID}
	}
	e.log = e.p.o.Logger.With("job", opts.JobID)
	hostTmp, err := os.MkdirTemp("", "custom-executor")
	if err != nil {
		return executor.Environment{}, fmt.Errorf("preparing custom executor: %w", err)
	}
	scope := markerScope(opts.SystemID, opts.ShortToken)
	s := &session{
		opts: opts, job: job, project: project,
		hostTmp:      hostTmp,
		responseFile: filepath.Join(hostTmp, "response.json"),
		exitCodeFile: filepath.Join(hostTmp, "build_exit_code"),
		scope:        scope,
		jobMarker:    reap.NewScopedMarker(scope),
	}
	e.sess = s
	b, err := json.Marshal(job)
	if err != nil {
		return executor.Environment{}, fmt.Errorf("writing JOB_RESPONSE_FILE: %w", err)
	}
	if err := os.WriteFile(s.responseFile, append(b, '\n'), 0o600); err != nil {
		return executor.Environment{}, fmt.Errorf("writing JOB_RESPONSE_FILE: %w", err)
	}
	out := opts.Output
	if out == nil {
		out = io.Discard
	}
	for attempt := 1; ; attempt++ {
		env, err := e.prepareOnce(ctx, s, out)
		if err == nil {
			return env, nil
		}
		if attempt == prepareAttempts || !retryable(err) || ctx.Err() != nil {
			return executor.Environment{}, err
		}
		// As gitlab-runner, which cleans up the failed executor and
		// prepares a new one.
		fmt.Fprintf(out, "WARNING: Preparation failed: %v\n", err)
		if cerr := e.cleanupExec(ctx, s); cerr != nil {
			e.log.Warn("cleanup_exec after a failed preparation", "err", cerr)
		}
		_, _ = reap.Signal(s.jobMarker, syscall.SIGKILL)
		fmt.Fprintf(out, "Will be retried in %s ...\n", e.p.o.PrepareRetryDelay)
		t := time.NewTimer(e.p.o.PrepareRetryDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return executor.Environment{}, stopped("preparing custom executor", ctx)
		}
	}
}

// retryable reports whether a failed preparation is attempted again: when
// the driver failed (a system failure, an unknown exit code, a program
// that ran into its timeout), not when it reported a build failure or
// when the configuration is wrong.
func retryable(err error) bool {
	var de *DriverError
	return errors.As(err, &de) || errors.Is(err, context.DeadlineExceeded)
}

// prepareOnce is one attempt: config_exec, then prepare_exec.
func (e *Executor) prepareOnce(ctx context.Context, s *session, out io.Writer) (executor.Environment, error) {
	t := e.p.timeouts
	s.cfg, s.env = ConfigOutput{}, executor.Environment{}
	e.setVariables(s, false)
	if c := e.p.o.Config; c.ConfigExec != "" {
		buf := &limitedBuffer{max: maxConfigOutput}
		cctx, cancel := withExecTimeout(ctx, "config_exec_timeout", t.config)
		call := e.call(s, "config_exec", c.ConfigExec, c.ConfigArgs, s.jobMarker)
		call.stdout, call.stderr = buf, out
		if err := s.resetExitCode(); err != nil {
			cancel()
			return executor.Environment{}, err
		}
		st, err := e.invoke(cctx, call)
		cancel()
		if err == nil {
			err = preparationOutcome(call, st, s.exitCodeFile)
		}
		if err != nil {
			return executor.Environment{}, err
		}
		if buf.over > 0 {
			return executor.Environment{}, fmt.Errorf("parsing config_exec output: more than %d bytes", maxConfigOutput)
		}
		if s.cfg, err = parseConfigOutput(buf.buf.Bytes()); err != nil {
			return executor.Environment{}, err
		}
	}
	env, err := e.environment(s)
	if err != nil {
		return executor.Environment{}, err
	}
	s.env = env
	e.setVariables(s, true)
	fmt.Fprintln(out, s.cfg.startupLine())
	if c := e.p.o.Config; c.PrepareExec != "" {
		pctx, cancel := withExecTimeout(ctx, "prepare_exec_timeout", t.prepare)
		call := e.call(s, "prepare_exec", c.PrepareExec, c.PrepareArgs, s.jobMarker)
		call.stdout = out
		if err := s.resetExitCode(); err != nil {
			cancel()
			return executor.Environment{}, err
		}
		st, err := e.invoke(pctx, call)
		cancel()
		if err == nil {
			err = preparationOutcome(call, st, s.exitCodeFile)
		}
		if err != nil {
			return executor.Environment{}, err
		}
	}
	return env, nil
}

// preparationOutcome is outcome for config_exec and prepare_exec: a build
// failure fails the prepare_executor stage, and says which program
// reported it.
func preparationOutcome(c call, st status, exitCodeFile string) error {
	err := outcome(c, st, executor.StagePrepareExecutor, exitCodeFile)
	var ee *executor.ExitError
	if errors.As(err, &ee) {
		return fmt.Errorf("%s %s: %w", c.program, c.path, err)
	}
	return err
}

// resetExitCode removes BUILD_EXIT_CODE_FILE: a code an earlier call left
// must not be taken for the next one's.
func (s *session) resetExitCode() error {
	if err := os.Remove(s.exitCodeFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing BUILD_EXIT_CODE_FILE: %w", err)
	}
	return nil
}

// environment is the job's environment from config_exec's output, the
// runner's configuration and the provider's defaults.
func (e *Executor) environment(s *session) (executor.Environment, error) {
	cfg, o := s.cfg, s.opts
	buildsDir := cmp.Or(deref(cfg.BuildsDir), o.BuildsDir, e.p.o.BuildsDir)
	cacheDir := cmp.Or(deref(cfg.CacheDir), o.CacheDir, e.p.o.CacheDir)
	for _, d := range []struct{ key, dir string }{{"builds_dir", buildsDir}, {"cache_dir", cacheDir}} {
		key, dir := d.key, d.dir
		if dir == "" {
			return executor.Environment{}, fmt.Errorf("the %s is not configured: set [[runners]] %s or print %q from config_exec", key, key, key)
		}
		if !path.IsAbs(dir) {
			return executor.Environment{}, fmt.Errorf("%s %q: must be an absolute path in the driver's environment", key, dir)
		}
	}
	root := path.Clean(buildsDir)
	if cfg.BuildsDirIsShared != nil && *cfg.BuildsDirIsShared {
		root = path.Join(root, o.ShortToken, strconv.Itoa(o.ConcurrencyID))
	}
	shell := cmp.Or(deref(cfg.Shell), o.Shell, "bash")
	if shell != "bash" && shell != "sh" {
		return executor.Environment{}, fmt.Errorf("shell %q is not supported by the custom executor (bash or sh)", shell)
	}
	buildDir := path.Join(root, s.project)
	return executor.Environment{
		BuildDir: buildDir,
		TmpDir:   buildDir + ".tmp",
		CacheDir: path.Clean(cacheDir),
		Shell:    shell,
		Helper:   e.p.helper,
		Hostname: deref(cfg.Hostname),
	}, nil
}

// setVariables computes the CUSTOM_ENV_* entries; withDirs once the
// environment's directories are known.
func (e *Executor) setVariables(s *session, withDirs bool) {
	o := s.opts
	pub := func(k, v string) runnerapi.Variable {
		return runnerapi.Variable{Key: k, Value: v, Public: true, Raw: true}
	}
	facts := []runnerapi.Variable{
		pub("CI_CONCURRENT_ID", strconv.Itoa(o.ConcurrencyID)),
		pub("CI_CONCURRENT_PROJECT_ID", strconv.Itoa(o.ConcurrencyID)),
		pub("CI_RUNNER_SHORT_TOKEN", o.ShortToken),
	}
	if o.JobID != 0 {
		facts = append(facts, pub("CI_JOB_ID", strconv.FormatInt(o.JobID, 10)))
	}
	// Before config_exec has described the environment, its directories
	// are unknown: config_exec sees none, not the job's.
	var hide []string
	if withDirs {
		facts = append(facts,
			pub("CI_BUILDS_DIR", strings.TrimSuffix(s.env.BuildDir, "/"+s.project)),
			pub("CI_PROJECT_DIR", s.env.BuildDir))
	} else {
		hide = []string{"CI_BUILDS_DIR", "CI_PROJECT_DIR"}
	}
	s.vars = jobVariables(s.job, facts, hide...)
	s.custom = customEnv(s.vars, servicesJSON(s.job.Services, s.vars))
}

// call describes a call of a driver program for s, with marker in its
// environment.
func (e *Executor) call(s *session, program, exe string, args []string, marker string) call {
	env := append(os.Environ(), e.p.o.Env...)
	keys := make([]string, 0, len(s.cfg.JobEnv))
	for k := range s.cfg.JobEnv {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = append(env, k+"="+s.cfg.JobEnv[k])
	}
	env = append(env, s.custom...)
	// The protocol's own variables come last: neither the runner's
	// environment nor job_env can change them.
	env = append(env,
		"TMPDIR="+s.hostTmp,
		"BUILD_FAILURE_EXIT_CODE="+strconv.Itoa(BuildFailureExitCode),
		"SYSTEM_FAILURE_EXIT_CODE="+strconv.Itoa(SystemFailureExitCode),
		"BUILD_EXIT_CODE_FILE="+s.exitCodeFile,
		"JOB_RESPONSE_FILE="+s.responseFile,
		"BERTH_HELPER="+e.p.helper,
		reap.Env(marker),
	)
	t := e.p.timeouts
	return call{
		program: program, path: exe, args: slices.Clone(args), dir: s.hostTmp, env: env,
		graceful: t.graceful, force: t.force,
	}
}

// Run implements executor.Executor.
func (e *Executor) Run(ctx context.Context, cmd executor.Command) error {
	e.mu.Lock()
	if e.state != prepared {
		st := e.state
		e.mu.Unlock()
		return fmt.Errorf("stage %s: %w (executor %s)", cmd.Stage, executor.ErrNotPrepared, st)
	}
	s := e.sess
	first := !s.ran
	s.ran, s.tmpGone = true, false
	e.mu.Unlock()
	if ctx.Err() != nil {
		return stopped("stage "+cmd.Stage, ctx)
	}
	out := cmd.Output
	if out == nil {
		out = io.Discard
	}
	removeTmp := cmd.Stage == executor.StageCleanupFileVariables
	script := stageScript(s.env, cmd.Script, first, removeTmp)
	err := e.runStage(ctx, s, cmd.Stage, script, out)
	if err == nil && removeTmp {
		e.mu.Lock()
		s.tmpGone = true
		e.mu.Unlock()
	}
	return err
}

// stageArg is the stage name run_exec gets: GitLab's, which still calls
// the main script's stage build_script.
func stageArg(stage string) string {
	if stage == executor.StageStepScript {
		return "build_script"
	}
	return stage
}

// runStage calls run_exec once for a stage.
func (e *Executor) runStage(ctx context.Context, s *session, stage, script string, out io.Writer) error {
	dir, err := os.MkdirTemp(s.hostTmp, "script")
	if err != nil {
		return fmt.Errorf("stage %s: writing script: %w", stage, err)
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "script")
	if err := os.WriteFile(file, []byte(script), 0o700); err != nil {
		return fmt.Errorf("stage %s: writing script: %w", stage, err)
	}
	if err := os.Chmod(file, 0o700); err != nil {
		return fmt.Errorf("stage %s: writing script: %w", stage, err)
	}
	if err := s.resetExitCode(); err != nil {
		return fmt.Errorf("stage %s: %w", stage, err)
	}
	c := e.p.o.Config
	marker := reap.NewScopedMarker(s.scope)
	call := e.call(s, "run_exec", c.RunExec, append(slices.Clone(c.RunArgs), file, stageArg(stage)), marker)
	call.stdout, call.stageMarker = out, marker
	st, err := e.invoke(ctx, call)
	if err == nil {
		err = outcome(call, st, stage, s.exitCodeFile)
	}
	var ee *executor.ExitError
	if err != nil && !errors.As(err, &ee) {
		return fmt.Errorf("stage %s: %w", stage, err)
	}
	return err
}

// shq quotes s for POSIX sh.
func shq(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// stageScript is the file run_exec gets for a stage: it creates and
// enters the build directory and the temporary directory (first: empty
// it before), runs the runner's script in a subshell with stdin from
// /dev/null (the file itself may be the shell's stdin), and for
// removeTmp removes the temporary directory after it, keeping the
// script's exit status.
func stageScript(env executor.Environment, script string, first, removeTmp bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "#!/usr/bin/env %s\n", env.Shell)
	b.WriteString("# Generated by berth's custom executor: one stage of a job.\n")
	build, tmp := shq(env.BuildDir), shq(env.TmpDir)
	if first {
		fmt.Fprintf(&b, "rm -rf -- %s\n", tmp)
	}
	fmt.Fprintf(&b, "mkdir -p -- %s %s && chmod 700 %s && cd %s || exit 1\n", build, tmp, tmp, build)
	fmt.Fprintf(&b, "( eval %s ) </dev/null\n", shq(script))
	if removeTmp {
		fmt.Fprintf(&b, "rc=$?\nrm -rf -- %s\nexit $rc\n", tmp)
	}
	return b.String()
}

// removeTmpScript removes the temporary directory in the environment.
func removeTmpScript(env executor.Environment) string {
	return fmt.Sprintf("#!/usr/bin/env %s\nrm -rf -- %s\n", env.Shell, shq(env.TmpDir))
}

// Cleanup implements executor.Executor.
func (e *Executor) Cleanup(ctx context.Context) error {
	e.mu.Lock()
	if e.state == cleaned {
		e.mu.Unlock()
		return nil
	}
	st, s := e.state, e.sess
	e.state = cleaned
	leftTmp := s != nil && s.ran && !s.tmpGone
	e.mu.Unlock()
	e.killRunning()
	if s == nil {
		return nil
	}
	var errs []error
	if st == prepared && leftTmp {
		w := &logWriter{log: e.log, level: slog.LevelDebug, msg: "run_exec output while removing the temporary directory"}
		err := e.runStage(ctx, s, executor.StageCleanupFileVariables, removeTmpScript(s.env), w)
		w.flush()
		if err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", s.env.TmpDir, err))
		}
	}
	if err := e.cleanupExec(ctx, s); err != nil {
		errs = append(errs, err)
	}
	_, _ = reap.Signal(s.jobMarker, syscall.SIGKILL)
	if err := os.RemoveAll(s.hostTmp); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleaning up custom executor: %w", err)
	}
	return nil
}

// cleanupExec calls cleanup_exec (if configured): stdout to the runner's
// log at debug level, stderr at warn level.
func (e *Executor) cleanupExec(ctx context.Context, s *session) error {
	c := e.p.o.Config
	if c.CleanupExec == "" {
		return nil
	}
	cctx, cancel := withExecTimeout(ctx, "cleanup_exec_timeout", e.p.timeouts.cleanup)
	defer cancel()
	call := e.call(s, "cleanup_exec", c.CleanupExec, c.CleanupArgs, s.jobMarker)
	stdout := &logWriter{log: e.log.With("cleanup_std", "out"), level: slog.LevelDebug, msg: "cleanup_exec"}
	stderr := &logWriter{log: e.log.With("cleanup_std", "err"), level: slog.LevelWarn, msg: "cleanup_exec"}
	call.stdout, call.stderr = stdout, stderr
	st, err := e.invoke(cctx, call)
	stdout.flush()
	stderr.flush()
	if err != nil {
		return err
	}
	if st.code != 0 {
		return &DriverError{Program: call.program, Path: call.path, Code: st.code, Signal: st.sig}
	}
	return nil
}

// track adds or removes a running driver program.
func (e *Executor) track(g group, add bool) {
	e.gmu.Lock()
	defer e.gmu.Unlock()
	if e.groups == nil {
		e.groups = map[int]group{}
	}
	if add {
		e.groups[g.pgid] = g
	} else {
		delete(e.groups, g.pgid)
	}
}

// killRunning kills the driver programs still running (Cleanup while a
// call is under way: misuse, but nothing may survive Cleanup).
func (e *Executor) killRunning() {
	e.gmu.Lock()
	defer e.gmu.Unlock()
	for _, g := range e.groups {
		_ = g.signal(syscall.SIGKILL)
	}
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
