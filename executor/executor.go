// Package executor is the contract between the runner manager and the
// environments jobs run in. It has no implementations: those live in
// subpackages (shell, and later docker, ssh, custom, instance, …) and are
// wired in cmd/berth through an explicit list.
//
// Every stage of a job is a shell script the runner generates; an executor
// only answers three questions: how to prepare an environment for one job,
// how to run a script in it with streamed output and an exit status, and
// how to clean it up. Work that needs more than a shell (artifact and cache
// archives, talking to the coordinator's artifacts API) is done by the
// berth binary acting as a helper inside the environment; Prepare says
// where that binary is (Environment.Helper).
//
// # Lifecycle of an Executor
//
//	Provider.Create
//	      │
//	      ▼
//	 ┌─────────┐  Prepare fails / ctx done  ┌────────┐
//	 │ created │ ─────────────────────────► │ failed │
//	 └─────────┘                            └────────┘
//	      │ Prepare ok                           │
//	      ▼                                      │
//	 ┌──────────┐ ◄──┐                           │
//	 │ prepared │    │ Run (one at a time;       │
//	 └──────────┘ ───┘ exit status or error)     │
//	      │                                      │
//	      │ Cleanup                     Cleanup  │
//	      ▼                                      │
//	 ┌─────────┐ ◄───────────────────────────────┘
//	 │ cleaned │  (Cleanup again: no-op, nil)
//	 └─────────┘
//
// Rules every implementation keeps (executortest checks them):
//
//   - Cleanup is called exactly once by the runner after Create, whatever
//     happened before, including after a failed or canceled Prepare; it is
//     idempotent and must release everything (processes, temporary files,
//     containers). It gets its own context: the job's may be done.
//   - Run is only valid in the prepared state; in any other state it
//     returns an error (ErrNotPrepared) and runs nothing.
//   - Runs of one Executor are sequential. A Run may follow a Run whose
//     context was canceled (after_script runs after a canceled script).
//   - When a stage ends or its context is done, every process it started
//     is stopped: also those that left its process group or session
//     (setsid, double fork), and whatever runs inside containers or VMs
//     the stage made. After Cleanup nothing of the job remains but the
//     build directory and the cache.
//   - Executors created by one Provider are independent and may be used
//     from different goroutines at the same time; environments of jobs with
//     different concurrency ids never share a build directory.
package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/berthci/berth/runnerapi"
)

// Provider creates executors. It is long-lived (one per [[runners]]
// entry) and safe for concurrent use.
type Provider interface {
	// Create returns a new Executor for one job, in the created state. It
	// does not prepare anything yet.
	Create(ctx context.Context) (Executor, error)
}

// Executor runs the stages of one job in one environment. See the package
// documentation for its lifecycle.
type Executor interface {
	// Prepare creates the job's environment: build, temporary and cache
	// directories, the shell, the helper binary. On failure the executor
	// is in the failed state and only Cleanup is valid. If ctx is done,
	// Prepare stops and returns an error wrapping ctx's error.
	Prepare(ctx context.Context, opts PrepareOptions) (Environment, error)

	// Run runs one stage's script to completion in the environment,
	// streaming its combined stdout and stderr to cmd.Output as it is
	// produced. It returns nil on exit status 0, an *ExitError for any
	// other exit status, and any other error when the script could not be
	// run at all (a system failure). When ctx is done the whole process
	// tree of the script is stopped (terminate, then kill after a grace
	// period) and Run returns an error wrapping ctx's error and its cause once the tree
	// is gone. Processes a script leaves behind are stopped when the
	// script ends.
	Run(ctx context.Context, cmd Command) error

	// Cleanup releases the environment; see the package rules. The build
	// directory may be kept for the next job (GIT_STRATEGY=fetch); the
	// temporary directory is removed.
	Cleanup(ctx context.Context) error
}

// Snapshotter is an executor that can save the job's environment as it
// is now — a VM's memory, devices and disk — as a bundle `berth debug`
// restores. The environment runs on afterwards.
type Snapshotter interface {
	// Snapshot writes the bundle to w. ErrNoSnapshots when this
	// executor's environments cannot be saved (as configured).
	Snapshot(ctx context.Context, o SnapshotOptions, w io.Writer) error
}

// Brancher is an executor that can save the job's prepared environment,
// as it is now, as a branch point that later executors of the same
// Provider start from (PrepareOptions.Branch) instead of preparing one:
// the runner branches a parallel:matrix job's VM once the matrix's common
// prefix ran in it. The environment runs on afterwards.
type Brancher interface {
	// Branch saves the environment. ErrNoBranching when this executor's
	// environments cannot be branched (as configured).
	Branch(ctx context.Context) (Branch, error)
}

// BranchDecider is a Brancher that tells, before Prepare, whether the
// environment it will prepare for a job can be branched (one that picks
// its executor by the job's isolation level).
type BranchDecider interface {
	CanBranch(job *runnerapi.JobResponse, isolation Isolation) bool
}

// Branch is a branch point a Brancher made.
type Branch interface {
	// Drop removes it; environments started from it run on.
	Drop(ctx context.Context) error
}

// ErrNoBranching is an executor that cannot branch its environments.
var ErrNoBranching = errors.New("this executor cannot branch its environment")

// ErrNoSnapshots is an executor that cannot save its environments.
var ErrNoSnapshots = errors.New("this executor cannot save a snapshot of its environment")

// SnapshotOptions say what a snapshot records of its job.
type SnapshotOptions struct {
	JobID   int64
	JobName string
	Project string
	// Point is when it is taken (e.g. on_failure).
	Point string
	// Env are the job's variables a debugger's shell gets, KEY=VALUE
	// (the runner leaves masked and file variables out).
	Env []string
}

// PrepareOptions describe the job an environment is for.
type PrepareOptions struct {
	JobID int64
	// ProjectPath is the project's full path (group/project), used in the
	// build directory. It must be relative and must not contain "..".
	ProjectPath string
	// ShortToken is the runner's short token (token.Short), used in the
	// build directory so runners sharing a host never collide.
	ShortToken string
	// ConcurrencyID is the slot of this job among the runner's running
	// jobs (CI_CONCURRENT_ID): 0, 1, … Two jobs running at the same time
	// never share one.
	ConcurrencyID int
	// BuildsDir and CacheDir are the configured builds_dir and cache_dir;
	// empty means the executor's defaults.
	BuildsDir string
	CacheDir  string
	// Shell is the configured shell (bash or sh); empty means bash. An
	// executor without bash falls back to sh.
	Shell string
	// Output receives messages of the preparation itself. It is safe for
	// concurrent use (the job's trace) and stays open until Cleanup.
	Output io.Writer
	// DebugServices: the job asked for its services' logs in its log
	// (CI_DEBUG_SERVICES, which the runner may refuse); an executor with
	// services streams them into Output, each line prefixed with the
	// service, until Cleanup.
	DebugServices bool
	// User is the runner's user setting (config.toml's user, or
	// `berth runner run --user`): the shell executor runs the job's stages
	// as this user; the other executors ignore it, as gitlab-runner's do.
	User string
	// Job is the job's payload as the coordinator handed it out: image,
	// services, variables, git and runner info. Executors read it and
	// never modify it; it is nil only in tests of executors that need
	// nothing from it.
	Job *runnerapi.JobResponse
	// SystemID is the runner manager's system id (for names and labels of
	// what an executor creates, so a restarted manager finds its own).
	SystemID string
	// Reservation is the key the runner reserved capacity under before it
	// asked for this job (Reserver); "" for providers without one.
	Reservation string
	// Isolation is the level the job asked for (IsolationNone when it
	// asked for none); a provider offering several runs the job at the
	// weakest of them that is at least as strong.
	Isolation Isolation
	// ServerURL is the coordinator's URL as the runner reaches it, which
	// the helper in the environment uses too (an executor whose
	// environment has no route to it, a VM's, tunnels it).
	ServerURL string
	// Snapshot, when set, is a snapshot bundle (Snapshotter.Snapshot of
	// an executor of the same kind, on this machine or another) the
	// environment resumes instead of starting afresh; Environment is the
	// snapshotted job's (directories, shell) but for its Hostname.
	// ErrNoSnapshots when this executor cannot.
	Snapshot io.Reader
	// Branch, when set, is a branch point of this Provider's (made by
	// Brancher.Branch) the environment starts from, with the branched
	// environment's directories, files and processes: Environment is
	// the branched one's but for its Hostname.
	Branch Branch
}

// Environment is what Prepare made, as seen from inside the environment.
type Environment struct {
	// BuildDir is where the project is checked out
	// (<builds_dir>/<short token>/<concurrency id>/<project path>).
	BuildDir string
	// TmpDir is private to the job and removed by Cleanup (file
	// variables, generated scripts).
	TmpDir string
	// CacheDir is the local cache root.
	CacheDir string
	// Shell is the shell scripts run with: "bash" or "sh". Scripts the
	// runner generates for "sh" are POSIX.
	Shell string
	// Helper is the path of the berth binary to run as
	// "<Helper> helper …" inside the environment.
	Helper string
	// Hostname is the environment's host name (shown in the job log).
	Hostname string
	// Variables are added to the job's variables, before those of the
	// job (GITLAB_RUNNER_SLOT_CGROUP of the autoscaled executors).
	Variables []runnerapi.Variable
	// Disposable is set when the environment — its home directory and
	// global configuration — exists for this job alone (a container or a
	// VM of its own): the runner may then change it for the job, as
	// gitlab-runner's safe_directory_checkout does on such executors.
	Disposable bool
	// Local is set when the environment's files are the runner's own, as
	// the runner process sees them (the shell executor): stages that only
	// move files (cache, artifacts, file variables' cleanup) then run in
	// the runner's process, with the helper's code but without a shell
	// and a helper process per stage.
	Local bool
}

// Stage names, as GitLab names them (gitlab-protocol.md §5.5).
const (
	StagePrepareExecutor          = "prepare_executor"
	StagePrepareScript            = "prepare_script"
	StageGetSources               = "get_sources"
	StageRestoreCache             = "restore_cache"
	StageDownloadArtifacts        = "download_artifacts"
	StageStepScript               = "step_script"
	StageAfterScript              = "after_script"
	StageArchiveCache             = "archive_cache"
	StageArchiveCacheOnFailure    = "archive_cache_on_failure"
	StageUploadArtifactsOnSuccess = "upload_artifacts_on_success"
	StageUploadArtifactsOnFailure = "upload_artifacts_on_failure"
	StageCleanupFileVariables     = "cleanup_file_variables"
)

// Command is one stage to run.
type Command struct {
	// Stage is the stage name (StageGetSources, StageStepScript, or
	// "step_<name>" for other steps).
	Stage string
	// Script is the complete script, for Environment.Shell.
	Script string
	// Output receives stdout and stderr. The executor never calls Write
	// concurrently.
	Output io.Writer
	// KeepProcesses: the processes the stage started outlive it, for the
	// next stage continues it (a parallel:matrix job's before_script,
	// branched before its script). Executors that end a stage's
	// processes with the stage honour it when it exits by itself.
	KeepProcesses bool
}

// ExitError is a script that ended with a non-zero exit status.
type ExitError struct {
	Stage string
	Code  int
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("stage %s: exit status %d", e.Stage, e.Code)
}

// SafeName maps s to a name usable as one file or directory name on any
// system: letters, digits, '_' and '-' are kept, anything else becomes
// '_' (so "." and ".." cannot come out).
func SafeName(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, s)
}

// CleanProjectPath checks PrepareOptions.ProjectPath as every executor
// must before it joins it to a directory: relative, "/"-separated, no
// empty, "." or ".." component, no backslash or control character.
func CleanProjectPath(p string) (string, error) {
	if p == "" {
		return "", errors.New("project path is empty")
	}
	if strings.HasPrefix(p, "/") || strings.ContainsAny(p, "\\\n\r\x00") {
		return "", fmt.Errorf("project path %q: must be relative, without backslashes or control characters", p)
	}
	for _, part := range strings.Split(p, "/") {
		if part == "" || part == "." || part == ".." {
			return "", fmt.Errorf("project path %q: empty, . or .. component", p)
		}
	}
	return p, nil
}

// RunnerFeatures sets the features the runner provides in any
// environment (variables, artifacts, cache, masking, …); a Describer adds
// what its executor offers on top (images, services).
func RunnerFeatures(f *runnerapi.Features) {
	f.Variables = true
	f.Artifacts = true
	f.Cache = true
	f.FallbackCacheKeys = true
	f.UploadMultipleArtifacts = true
	f.Refspecs = true
	f.Masking = true
	f.RawVariables = true
	f.ArtifactsExclude = true
	f.MultiBuildSteps = true
	f.ReturnExitCode = true
}

// ErrNotPrepared is returned by Run outside the prepared state.
var ErrNotPrepared = errors.New("executor is not prepared")

// Errors an executor wraps so that the runner reports GitLab's failure
// reason for them (image_pull_failure, runner_configuration_error) rather
// than a system failure.
var (
	// ErrImagePull: the job's image or a service's could not be had.
	ErrImagePull = errors.New("image pull failed")
	// ErrNotAllowed: the job asks for what the runner's configuration
	// refuses (an image, a service, a pull policy).
	ErrNotAllowed = errors.New("not allowed by the runner's configuration")
)

// Describer is an optional capability of a Provider: it fills in what the
// runner advertises to the coordinator (info.executor, info.shell and
// info.features).
type Describer interface {
	Describe(info *runnerapi.Info)
}

// Shutdowner is an optional capability of a Provider: it holds resources
// beyond single jobs (connections, plugin processes) and releases them
// when the runner manager stops, after every executor was cleaned up.
type Shutdowner interface {
	Shutdown(ctx context.Context) error
}

// SweepOptions name the runner whose leftovers Sweep removes.
type SweepOptions struct {
	// SystemID and ShortToken identify one [[runners]] entry of one
	// runner manager, as PrepareOptions do.
	SystemID   string
	ShortToken string
}

// Sweeper is an optional capability of a Provider: it removes what jobs
// of the named runner left behind when a previous runner manager process
// died without cleaning up (processes, containers, networks). The runner
// manager calls it once per [[runners]] entry at start, before it asks
// for jobs, so nothing of this runner is running then.
type Sweeper interface {
	Sweep(ctx context.Context, o SweepOptions) error
}

// Reserver is an optional capability of a Provider whose capacity is
// limited and must be reserved before the runner asks the coordinator for
// a job — the autoscaled executors: no capacity, no job request, as
// GitLab's runner does with taskscaler.
//
//	err := p.Reserve(ctx, key)  // ErrNoCapacity: do not ask for a job now
//	… no job: p.Unreserve(key)
//	… a job: Create, then Prepare with PrepareOptions.Reservation = key:
//	  the executor turns the reservation into its environment (an
//	  instance slot) and gives it back at Cleanup
//	p.Unreserve(key)            // after the job in any case; a no-op
//	                            // when Cleanup gave the capacity back
//
// A reservation says the runner may take a job, not that one waits: the
// runner holds one through every request, most of which bring no job, so
// a provider that scales does not grow for reservations alone (taskscaler
// counts one as demand once the runner Claims it or Prepare asks for its
// slot, or at once in preemptive mode, where Reserve grants a ready slot).
//
// Keys are unique per job request. Reserve and Unreserve are safe for
// concurrent use; Unreserve of an unknown key does nothing.
type Reserver interface {
	Reserve(ctx context.Context, key string) error
	Unreserve(key string)
}

// HeadroomReporter is an optional capability of a Reserver: how many more
// reservations Reserve would grant now (-1: no bound). A runner that
// announces its room ahead of jobs (the job push channel) announces no
// more than this, so the coordinator does not push jobs the runner would
// have to reject. Safe for concurrent use.
type HeadroomReporter interface {
	Headroom() int
}

// Claimer is an optional capability of a Reserver: Claim says the request
// made under key brought a job, so its reservation now stands for a job
// waiting for capacity (demand) rather than for a request that mostly
// brings none. The runner calls it as soon as it has the job, before
// Create, so that no capacity goes while the job is acknowledged and its
// secrets resolved; a Reserver without it learns of the job at Prepare.
// Claim of a key without a reservation does nothing. Safe for concurrent
// use.
type Claimer interface {
	Claim(key string)
}

// DemandSink is an optional capability of a Provider that scales: the
// runner reports how many jobs wait in the coordinator that it could take
// now (Berth's queue insight, bounded by the runner's free job slots), a
// few seconds apart, so the provider can get capacity ready before the
// requests for those jobs come. A report counts until the next one.
type DemandSink interface {
	SetDemand(waiting int)
}

// FleetReporter is an optional capability of a Provider that autoscales:
// a snapshot of its fleet (instances by phase, slots, boots, deletions,
// instance time), which the runner sends to the coordinator every few
// seconds (runnerapi.Fleet). SystemID is the runner's to fill. Safe for
// concurrent use.
type FleetReporter interface {
	Fleet() runnerapi.Fleet
}

// ErrNoCapacity is what Reserve wraps when there is no capacity for one
// more job now.
var ErrNoCapacity = errors.New("no capacity for another job")

// Isolation is an isolation level a job runs at (DESIGN's table), from
// weakest to strongest: none, cgroups, container, microvm, vm, instance.
type Isolation string

// The isolation levels.
const (
	IsolationNone      Isolation = "none"
	IsolationCgroups   Isolation = "cgroups"
	IsolationContainer Isolation = "container"
	IsolationMicroVM   Isolation = "microvm"
	IsolationVM        Isolation = "vm"
	IsolationInstance  Isolation = "instance"
)

// Isolations are the levels from weakest to strongest.
var Isolations = []Isolation{IsolationNone, IsolationCgroups, IsolationContainer, IsolationMicroVM, IsolationVM, IsolationInstance}

// ParseIsolation returns the level named s.
func ParseIsolation(s string) (Isolation, error) {
	for _, l := range Isolations {
		if string(l) == s {
			return l, nil
		}
	}
	return "", fmt.Errorf("unknown isolation level %q (want one of none, cgroups, container, microvm, vm, instance)", s)
}

// Rank is the level's position from weakest (0) to strongest; -1 for an
// unknown level.
func (l Isolation) Rank() int {
	for i, x := range Isolations {
		if x == l {
			return i
		}
	}
	return -1
}

// StrongerIsolation returns the stronger of two levels; an empty level
// (none named) loses to any other.
func StrongerIsolation(a, b Isolation) Isolation {
	if a == "" || (b != "" && b.Rank() > a.Rank()) {
		return b
	}
	return a
}

// IsolationAt returns the level of a rank, clamped to the known levels.
func IsolationAt(rank int) Isolation {
	return Isolations[min(max(rank, 0), len(Isolations)-1)]
}

// Isolator is an optional capability of a Provider: the isolation levels
// its jobs can run at. A Provider without it offers IsolationNone.
type Isolator interface {
	IsolationLevels() []Isolation
}
