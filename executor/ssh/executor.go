package ssh

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/internal/reap"
)

// Waits of a stage beyond Options.KillGrace. They only stop a broken
// host or a stray process from hanging a job.
const (
	// readyWait is how long a stop waits for the wrapper to be ready
	// (its trap installed) before signalling anyway.
	readyWait = 5 * time.Second
	// reapTimeout bounds one "berth helper reap" on the host.
	reapTimeout = 30 * time.Second
)

// leftoverWait is how long a stage's channel may stay open after the
// wrapper exited (a process it could not kill still holds the output)
// before the leftovers are killed again, and then before it is closed.
// A variable only so that tests can shorten it.
var leftoverWait = 5 * time.Second

type state int

const (
	created state = iota
	prepared
	failed
	cleaned
)

// Executor is one job's environment on the host.
type Executor struct {
	p *Provider

	mu    sync.Mutex
	state state
	conn  *client
	env   executor.Environment
	// jobScope prefixes the markers of this job's stages (Cleanup kills
	// them all by it); it starts with the runner's scope (Sweep).
	jobScope string
	// tmpDir is the TmpDir Prepare created ("" before), which Cleanup
	// removes. helperOK: the helper is on the host. ran: a stage was
	// started.
	tmpDir        string
	helperOK, ran bool
	seq           int
	// cgroup is the job's cgroup (nil: none); ooms the OOM kill count
	// seen last.
	cgroup *JobCgroup
	ooms   int
}

func (e *Executor) stateName() string {
	return [...]string{"created", "prepared", "failed", "cleaned"}[e.state]
}

// Prepare implements executor.Executor: it connects, learns the host's
// home, platform and shells, creates the directories and uploads the
// helper if the host does not have it yet — in one session besides the
// upload.
func (e *Executor) Prepare(ctx context.Context, opts executor.PrepareOptions) (executor.Environment, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state != created {
		return executor.Environment{}, fmt.Errorf("prepare: executor already %s", e.stateName())
	}
	env, err := e.prepare(ctx, opts)
	if err != nil {
		e.state = failed
		return executor.Environment{}, fmt.Errorf("preparing ssh environment on %s: %w", e.p.where(), err)
	}
	e.state, e.env = prepared, env
	return env, nil
}

func (e *Executor) prepare(ctx context.Context, opts executor.PrepareOptions) (executor.Environment, error) {
	if err := ctx.Err(); err != nil {
		return executor.Environment{}, err
	}
	proj, err := executor.CleanProjectPath(opts.ProjectPath)
	if err != nil {
		return executor.Environment{}, err
	}
	if opts.ConcurrencyID < 0 {
		return executor.Environment{}, fmt.Errorf("concurrency id %d: must not be negative", opts.ConcurrencyID)
	}
	short := opts.ShortToken
	if short == "" || strings.ContainsAny(short, "/\\\n") || short == "." || short == ".." {
		return executor.Environment{}, fmt.Errorf("short token %q: not usable in a path", short)
	}
	buildsDir := cmp.Or(opts.BuildsDir, e.p.opts.DefaultBuildsDir)
	cacheDir := cmp.Or(opts.CacheDir, e.p.opts.DefaultCacheDir)
	for _, d := range []string{buildsDir, cacheDir} {
		if strings.ContainsAny(d, "\n\r\x00") {
			return executor.Environment{}, fmt.Errorf("directory %q: control characters", d)
		}
	}
	switch opts.Shell {
	case "", "bash", "sh":
	default:
		return executor.Environment{}, fmt.Errorf("shell %q is not supported by the ssh executor (bash or sh)", opts.Shell)
	}
	hb, err := e.p.helperBinary()
	if err != nil {
		return executor.Environment{}, err
	}

	c, err := e.p.dial(ctx)
	if err != nil {
		return executor.Environment{}, err
	}
	if err := e.p.track(c); err != nil {
		return executor.Environment{}, err
	}
	e.conn = c
	pr, err := probeHost(ctx, c, probeRequest{
		helper: hb, dirs: true, buildsDir: buildsDir, cacheDir: cacheDir,
		sub: path.Join(short, strconv.Itoa(opts.ConcurrencyID), proj),
	})
	if err != nil {
		return executor.Environment{}, err
	}
	e.tmpDir = pr.buildDir + ".tmp"
	if err := checkPlatform(pr, hb); err != nil {
		return executor.Environment{}, err
	}
	if pr.helperSize != hb.size {
		if err := e.p.installHelper(ctx, c, pr.home, hb, opts.Output); err != nil {
			return executor.Environment{}, err
		}
	}
	e.helperOK = true

	shell := "sh"
	if opts.Shell != "sh" && pr.bash {
		shell = "bash"
	}
	if e.p.opts.Cgroup != nil {
		cg, err := e.p.opts.Cgroup(opts)
		if err != nil {
			return executor.Environment{}, err
		}
		if cg != nil {
			out, err := c.output(ctx, "exec /bin/sh -s", strings.NewReader(cg.Setup+"\n"+cg.OOMKills+"\n"))
			if err != nil {
				return executor.Environment{}, fmt.Errorf("setting up the job's cgroup (%s): %w", cg.Describe, err)
			}
			e.cgroup, e.ooms = cg, lastInt(out)
			if opts.Output != nil {
				fmt.Fprintf(opts.Output, "Running in %s\n", cg.Describe)
			}
		}
	}
	scope := markerScope(opts.SystemID, opts.ShortToken)
	if scope == "" {
		e.jobScope = randomHex(8)
	} else {
		e.jobScope = scope + "." + randomHex(4)
	}
	if opts.Output != nil {
		fmt.Fprintf(opts.Output, "Using %s executor with %s on %s (%s)...\n", e.p.opts.MessageName, shell, pr.host, e.p.where())
	}
	return executor.Environment{
		BuildDir: pr.buildDir,
		TmpDir:   e.tmpDir,
		CacheDir: pr.cacheDir,
		Shell:    shell,
		Helper:   remoteHelper(pr.home, hb),
		Hostname: pr.host,
	}, nil
}

// probeHost runs the probe (see probeRequest) and checks its answer.
func probeHost(ctx context.Context, c *client, req probeRequest) (probeResult, error) {
	nonce := randomHex(8)
	out, err := c.output(ctx, probeScript(nonce, req), nil)
	if err != nil {
		return probeResult{}, fmt.Errorf("probing the host: %w", err)
	}
	pr, err := parseProbe(nonce, out)
	if err != nil {
		return probeResult{}, fmt.Errorf("probing the host: %w", err)
	}
	if req.dirs && (!path.IsAbs(pr.buildDir) || !path.IsAbs(pr.cacheDir)) {
		return probeResult{}, fmt.Errorf("probing the host: directories %q and %q are not absolute", pr.buildDir, pr.cacheDir)
	}
	return pr, nil
}

// cleanProjectPath checks a project path as the shell executor does.

// Run implements executor.Executor.
func (e *Executor) Run(ctx context.Context, cmd executor.Command) error {
	e.mu.Lock()
	if e.state != prepared {
		st := e.stateName()
		e.mu.Unlock()
		return fmt.Errorf("stage %s: %w (executor %s)", cmd.Stage, executor.ErrNotPrepared, st)
	}
	e.seq++
	e.ran = true
	script := cmd.Script
	if e.cgroup != nil {
		script = e.cgroup.Enter + "\n" + script
	}
	st := &stage{
		p: e.p, c: e.conn, name: cmd.Stage, script: script, e: e,
		out: &stageOutput{w: cmd.Output},
		wrapper: stageWrapper{
			nonce:  randomHex(8),
			marker: reap.NewScopedMarker(e.jobScope),
			file:   path.Join(e.env.TmpDir, "stage-"+executor.SafeName(cmd.Stage)+"-"+strconv.Itoa(e.seq)+".sh"),
			dir:    e.env.BuildDir,
			shell:  e.env.Shell,
			helper: e.env.Helper,
		},
	}
	e.mu.Unlock()
	if st.out.w == nil {
		st.out.w = io.Discard
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("stage %s: %w", cmd.Stage, err)
	}
	return st.run(ctx)
}

// stage is one Run.
type stage struct {
	e       *Executor
	p       *Provider
	c       *client
	name    string
	script  string
	out     *stageOutput
	wrapper stageWrapper
}

func (st *stage) run(ctx context.Context) error {
	defer st.out.close()
	defer st.killCgroup()
	ctl := newControl(st.wrapper.nonce, st.out)
	proc, err := st.c.start(ctx, st.wrapper.command(), strings.NewReader(st.script), st.out, ctl)
	if err != nil {
		if ctx.Err() != nil {
			return st.stopped(ctx)
		}
		return fmt.Errorf("stage %s: %w", st.name, err)
	}
	// The wrapper reports the script's status, kills what the script
	// left behind, and exits; the channel closes once nothing holds the
	// stage's output any more.
	reported := ctl.exited
	var reapDeadline <-chan time.Time
wait:
	for {
		select {
		case <-proc.closed:
			break wait
		case <-proc.exited:
			st.drain(proc)
			break wait
		case <-reported:
			// Killing the leftovers should take moments; a wrapper
			// stuck at it does not hold the job.
			reported = nil
			t := time.NewTimer(reapTimeout)
			defer t.Stop()
			reapDeadline = t.C
		case <-reapDeadline:
			st.reap("KILL")
			proc.close()
			break wait
		case <-ctx.Done():
			st.stop(proc, ctl)
			return st.stopped(ctx)
		}
	}
	ctl.flush()
	code, ok, fail := ctl.result()
	switch {
	case ok && code == 0:
		return nil
	case ok:
		return &executor.ExitError{Stage: st.name, Code: code}
	}
	// No status: the wrapper could not run the script, was killed, or
	// the connection went away under it (then the stage may still run
	// on the host: Cleanup reconnects to kill it).
	if lost := st.c.check(readyWait); lost != nil {
		return fmt.Errorf("stage %s: %w", st.name, lost)
	}
	st.reap("KILL")
	if fail != "" {
		return fmt.Errorf("stage %s: %s on the host", st.name, fail)
	}
	return fmt.Errorf("stage %s: the stage wrapper on the host ended without reporting the script's status (%s)", st.name, proc.result())
}

// killCgroup kills what the stage left in the job's cgroup (also
// processes that cleared their environment and left its process group)
// and says in the job log when the kernel killed a process of the job for
// exceeding the cgroup's memory limit.
func (st *stage) killCgroup() {
	cg := st.e.cgroup
	if cg == nil || st.c.lost() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), reapTimeout)
	defer cancel()
	out, err := st.c.output(ctx, "exec /bin/sh -s", strings.NewReader(cg.Kill+"\n"+cg.OOMKills+"\n"))
	if err != nil {
		st.p.log.Warn("killing what a stage left in the job's cgroup failed", "stage", st.name, "err", err)
		return
	}
	st.e.mu.Lock()
	n, before := lastInt(out), st.e.ooms
	st.e.ooms = max(n, before)
	st.e.mu.Unlock()
	if n > before {
		// Run's deferred close of the output comes after this.
		fmt.Fprintf(st.out, "\x1b[31;1mERROR: the job exceeded the memory limit of its %s: the kernel killed %d process(es) of it (out of memory)\x1b[0;m\n", cg.Describe, n-before)
	}
}

// lastInt is the integer on the last non-empty line of out, 0 if none.
func lastInt(out []byte) int {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	n, _ := strconv.Atoi(strings.TrimSpace(lines[len(lines)-1]))
	return n
}

// drain waits for the channel of a command that has exited to close:
// what still holds its output is killed, and if that does not free it
// (a process beyond the marker's reach), the channel is given up.
func (st *stage) drain(proc *process) {
	if waitClosed(proc, leftoverWait) {
		return
	}
	st.reap("KILL")
	if !waitClosed(proc, leftoverWait) {
		st.p.log.Warn("a process beyond the stage's marker holds its output; giving up on it", "stage", st.name)
		proc.close()
	}
}

// stop stops a running stage whose context is done: SIGTERM to its
// processes through the helper, SIGKILL after the grace period, then it
// waits for the channel to close. It sends no SSH "signal" request: sshd
// would deliver it (where it honours it at all; OpenSSH refuses it for
// sessions without a terminal in some versions, and logs an error) to
// the session's own process only, which is the wrapper, which must
// survive SIGTERM to report the status and clean up.
func (st *stage) stop(proc *process, ctl *control) {
	exited := false
	select {
	case <-ctl.ready:
	case <-proc.exited:
		exited = true
	case <-proc.closed:
		exited = true
	case <-st.c.done:
	case <-time.After(readyWait):
	}
	if !exited {
		st.reap("TERM")
		grace := time.NewTimer(st.p.opts.KillGrace)
		select {
		case <-proc.exited:
		case <-proc.closed:
		case <-grace.C:
		case <-st.c.done:
		}
		grace.Stop()
	}
	// Also after the wrapper ended: a stage that died of SIGTERM may
	// have left processes that ignore it.
	st.reap("KILL")
	if !waitClosed(proc, leftoverWait) {
		proc.close()
	}
}

// stopped is Run's error for a stage whose context is done.
func (st *stage) stopped(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("stage %s: stopped: %w: %w", st.name, err, cause)
	}
	return fmt.Errorf("stage %s: stopped: %w", st.name, err)
}

// reap signals the stage's processes on the host through the helper, in
// a session of its own. Failures are logged: the stage's Run reports
// what matters, and Cleanup kills the job's processes again.
func (st *stage) reap(sig string) {
	if st.c.lost() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), reapTimeout)
	defer cancel()
	if _, err := st.c.output(ctx, reapCommand(st.wrapper.helper, "--marker", st.wrapper.marker, sig), nil); err != nil {
		st.p.log.Warn("signalling a stage's processes on the host failed", "stage", st.name, "signal", sig, "err", err)
	}
}

// waitClosed waits up to d for the command's channel to close.
func waitClosed(proc *process, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-proc.closed:
		return true
	case <-t.C:
		return false
	}
}

// stageOutput is a stage's output: the session's stdout and the
// wrapper's non-report stderr lines are copied by two goroutines, so it
// serialises their writes, and it drops writes after Run returned (a
// session given up on may still deliver).
type stageOutput struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (o *stageOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.closed {
		// The job's log failing must not stop the stage: keep draining.
		_, _ = o.w.Write(p)
	}
	return len(p), nil
}

func (o *stageOutput) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
}

// Cleanup implements executor.Executor: it kills every process of every
// stage of the job, removes TmpDir and closes the connection. When the
// connection was lost it connects again for that (bounded by ctx); if
// that fails too, it returns an error and the next runner start's Sweep
// kills what remains.
func (e *Executor) Cleanup(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state == cleaned {
		return nil
	}
	e.state = cleaned
	c := e.conn
	e.conn = nil
	if c == nil {
		return nil
	}
	defer e.p.untrack(c)
	defer c.Close()
	tmp := e.tmpDir
	if tmp == "" {
		return nil
	}
	if e.cgroup != nil && c.lost() == nil {
		if _, err := c.output(ctx, "exec /bin/sh -s", strings.NewReader(e.cgroup.Kill+"\n")); err != nil {
			e.p.log.Warn("killing what the job left in its cgroup failed", "err", err)
		}
	}
	var script []string
	if e.helperOK && e.ran {
		script = append(script, shq(e.env.Helper)+" helper reap --scope "+shq(e.jobScope)+" --signal KILL >/dev/null")
	}
	script = append(script, "rm -rf "+shq(tmp))
	run := c
	if c.lost() != nil {
		e.p.log.Info("connection was lost; reconnecting to clean up", "tmp", tmp)
		rc, err := e.p.dial(ctx)
		if err != nil {
			return fmt.Errorf("cleaning up on %s: processes of the job and %s may remain: %w", e.p.where(), tmp, err)
		}
		defer rc.Close()
		run = rc
	}
	if _, err := run.output(ctx, shScript(script...), nil); err != nil {
		return fmt.Errorf("cleaning up on %s: %w", e.p.where(), err)
	}
	return nil
}
