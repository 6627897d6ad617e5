// Package store is the coordinator's persistence contract. Implementations
// live in sub-packages (sqlite, later postgres) and all pass the conformance
// suite in storetest.
//
// The contract is deliberately small and state-machine shaped: every write
// that races with another coordinator goroutine (or, later, replica) is a
// conditional update that either applies or fails with ErrConflict, so the
// caller never needs a lock around the store to stay correct.
//
// Concurrency: every method is safe for concurrent use. Methods that return
// structs return fresh copies the caller may keep and modify.
//
// Secrets: the store never sees a plain token, only SHA-256 digests
// (lower-case hex, see package token).
package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Errors classified with errors.Is.
var (
	// ErrNotFound: the record does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict: a conditional update did not apply because the record
	// is not in the expected state (another writer won).
	ErrConflict = errors.New("conflict")
	// ErrBusy: a conditional update did not apply because another
	// writer's transaction, still in flight, holds the record; whether
	// that transaction changes it is not known yet (it may roll back, or
	// its process may die first). Look again shortly; the record may still
	// be as expected. Only stores that skip locked rows return it.
	ErrBusy = errors.New("busy: held by another transaction in flight")
	// ErrLastOwner: a membership change would leave a project without an
	// owner (MemberChange.KeepOwner).
	ErrLastOwner = errors.New("the project's last owner")
	// ErrExists: a unique constraint would be violated.
	ErrExists = errors.New("already exists")
	// ErrTraceArchived: the trace is no longer in the store but in the
	// artifact storage, under TraceInfo.ArchiveKey; it cannot be appended
	// to or read here until UnarchiveTrace brings it back.
	ErrTraceArchived = errors.New("trace archived")
)

// RangeError is returned by AppendTrace when the offset is not the current
// size of the trace. Size is the current size.
type RangeError struct{ Size int64 }

func (e *RangeError) Error() string {
	return fmt.Sprintf("trace offset does not match current size %d", e.Size)
}

// Status is a job status as GitLab names it.
type Status string

// Job statuses. A job is handed out while still StatusPending (two-phase
// commit: RunnerManagerID != 0 means "waiting for the runner's ack").
// Jobs of a pipeline start as created; the coordinator's pipeline engine
// moves them on when the jobs they wait for are done.
//
//	                     created ───────────────────────────► skipped
//	   (engine)  ┌──────────┼──────────────┬──────────────┐    │ (retry of an
//	             ▼          ▼              ▼              │    ▼  upstream job)
//	          manual    scheduled   waiting_for_resource  │  created
//	        play │   due/play │      resource free │      │
//	             └──────────┬─┴────────────────────┘      │
//	           enqueue      ▼ ◄───────────────────────────┘
//	 ┌─────── pending ◄──────────── (ack timeout: Unassign)
//	 │            │ Assign (pending, manager set)
//	 │            ▼ ack: PUT state=running
//	 │         running ──────────────► success | failed
//	 │            │ cancel
//	 │            ▼
//	 └──────► canceling ─────────────► canceled
//	cancel of a job not
//	handed out (any waiting status) ─► canceled
const (
	StatusCreated            Status = "created"
	StatusWaitingForResource Status = "waiting_for_resource"
	StatusManual             Status = "manual"
	StatusScheduled          Status = "scheduled"
	StatusPending            Status = "pending"
	StatusRunning            Status = "running"
	StatusSuccess            Status = "success"
	StatusFailed             Status = "failed"
	StatusCanceling          Status = "canceling"
	StatusCanceled           Status = "canceled"
	StatusSkipped            Status = "skipped"
)

// Statuses lists every job status.
var Statuses = []Status{
	StatusCreated, StatusWaitingForResource, StatusManual, StatusScheduled, StatusPending,
	StatusRunning, StatusSuccess, StatusFailed, StatusCanceling, StatusCanceled, StatusSkipped,
}

// Finished reports whether s is a final status.
func (s Status) Finished() bool {
	return s == StatusSuccess || s == StatusFailed || s == StatusCanceled || s == StatusSkipped
}

// Valid reports whether s is one of Statuses.
func (s Status) Valid() bool {
	for _, v := range Statuses {
		if s == v {
			return true
		}
	}
	return false
}

// Creatable reports whether a job may be created with status s: any status
// a job has before a runner holds it (the empty status means pending).
func (s Status) Creatable() bool {
	switch s {
	case "", StatusCreated, StatusWaitingForResource, StatusManual, StatusScheduled, StatusPending:
		return true
	}
	return false
}

// RunnerType is the scope of a runner.
type RunnerType string

// Runner scopes, as GitLab names them.
const (
	InstanceType RunnerType = "instance_type"
	GroupType    RunnerType = "group_type"
	ProjectType  RunnerType = "project_type"
)

// AccessLevel limits a runner to protected refs.
type AccessLevel string

// Access levels, as GitLab names them.
const (
	NotProtected AccessLevel = "not_protected"
	RefProtected AccessLevel = "ref_protected"
)

// Runner is a registered runner (one token, possibly many managers).
type Runner struct {
	ID              int64
	Type            RunnerType
	GroupID         int64   // group runners: the group it belongs to
	ProjectIDs      []int64 // project runners: projects it may run jobs of
	Description     string
	MaintenanceNote string
	Tags            []string // normalized: trimmed, unique, sorted
	RunUntagged     bool
	Locked          bool
	Paused          bool
	AccessLevel     AccessLevel
	MaximumTimeout  int // seconds; 0 = no limit
	// Legacy is true for runners registered with a registration token
	// (DELETE /runners removes them; glrtr- tokens).
	Legacy          bool
	TokenDigest     string
	TokenObtainedAt time.Time
	TokenExpiresAt  time.Time // zero: never expires
	CreatedAt       time.Time
	ContactedAt     time.Time
}

// RunnerManager is one machine (system_id) using a runner's token.
type RunnerManager struct {
	ID          int64
	RunnerID    int64
	SystemID    string
	Info        []byte // JSON "info" object as last sent by the runner
	CreatedAt   time.Time
	ContactedAt time.Time
	// Fleet is the manager's last fleet report (JSON, Berth's
	// runnerapi.Fleet: its autoscaler's instances, slots and cost so
	// far), opaque to the store; nil for a manager that never sent one.
	// FleetReportedAt is when it came.
	Fleet           []byte
	FleetReportedAt time.Time
}

// RegistrationToken is a legacy registration token's digest and its scope.
// There is at most one per (Scope, ScopeID); ScopeID is 0 for InstanceType.
type RegistrationToken struct {
	Digest    string
	Scope     RunnerType
	ScopeID   int64
	CreatedAt time.Time
}

// Job is one CI job in the queue or after it.
type Job struct {
	ID          int64
	Status      Status
	ProjectID   int64
	NamespaceID int64
	// NamespaceIDs are the job's project's group ancestry (namespace first,
	// root last); a group runner of any of them may run the job.
	NamespaceIDs []int64
	PipelineID   int64
	Name         string
	Stage        string
	Ref          string
	Protected    bool     // ref is protected
	Tags         []string // normalized like Runner.Tags
	Priority     int      // higher first; FIFO within a priority
	Timeout      int      // seconds
	// Spec is the JSON job specification (the payload fields that are not
	// generated at hand-out). Opaque to the store.
	Spec []byte
	// Dependencies are ids of jobs whose artifacts this job downloads; its
	// token may read their artifacts.
	Dependencies []int64

	TokenDigest     string // digest of the job token of the current assignment
	RunnerID        int64
	RunnerManagerID int64

	FailureReason string
	ExitCode      int

	// Graph is the job's pipeline scheduling data (JSON: needs, when,
	// allow_failure, retry, ...), opaque to the store; nil outside
	// pipelines.
	Graph []byte
	// Retried is set on a job that a retry replaced: the pipeline's
	// latest job of that name is the one not retried.
	Retried bool
	// ScheduledAt is when a scheduled (delayed) job becomes pending.
	ScheduledAt time.Time
	// QueuedAt is when a job of a pipeline became pending (zero: at
	// CreatedAt); see QueuedSince.
	QueuedAt time.Time
	// Isolation is the isolation level the job asks for (none, cgroups,
	// container, microvm, vm, instance; empty: it asks for none). The
	// coordinator raises it to the project's minimum when queueing.
	Isolation string

	CreatedAt  time.Time // enqueued
	AssignedAt time.Time // handed out (zero while queued)
	StartedAt  time.Time // acked (running)
	FinishedAt time.Time
	UpdatedAt  time.Time // last sign of life from the runner (or enqueue)
	// DebugTrace is set once its runner sent the job's log as a debug
	// trace (CI_DEBUG_TRACE): the log may show every variable's value.
	DebugTrace bool
	// ErasedAt is when the job's artifacts and log were erased (zero:
	// never). Only TransitionJob sets it; CreateJob ignores it.
	ErasedAt time.Time
}

// JobFilter selects jobs for ListJobs. Zero fields do not filter.
type JobFilter struct {
	// IDs, when not empty, keeps only these jobs.
	IDs        []int64
	Statuses   []Status
	ProjectID  int64
	PipelineID int64
	// RunnerID keeps the jobs handed out to that runner.
	RunnerID      int64
	UpdatedBefore time.Time // UpdatedAt < UpdatedBefore
	Limit         int
}

// Assignment hands a pending job to a runner manager.
type Assignment struct {
	JobID       int64
	RunnerID    int64
	ManagerID   int64
	TokenDigest string
	At          time.Time
}

// JobUpdate is applied by TransitionJob. Zero fields are left unchanged,
// except that Status is always set.
type JobUpdate struct {
	Status        Status
	FailureReason string
	ExitCode      int
	StartedAt     time.Time
	FinishedAt    time.Time
	UpdatedAt     time.Time
	ScheduledAt   time.Time
	// Dependencies replaces the job's dependencies when not nil (an empty,
	// non-nil slice clears them).
	Dependencies []int64
	// QueuedAt is set when not zero (a job of a pipeline entering the
	// queue).
	QueuedAt time.Time
	// ErasedAt is set when not zero (the job's data was erased).
	ErasedAt time.Time
	// Assign, when not nil, hands the job to a runner manager as AssignJob
	// does (its JobID is ignored): a job entering the queue stored already
	// handed out, because a runner was waiting for it.
	Assign *Assignment
	// IfTokenDigest, when not empty, is a condition, not a change: the
	// update applies only while the job's token digest is this one (the
	// acknowledgement of one hand-out, which must not apply to the job
	// handed out again meanwhile); ErrConflict otherwise.
	IfTokenDigest string
}

// QueuedSince is when the job entered the queue: QueuedAt, else CreatedAt.
func (j *Job) QueuedSince() time.Time {
	if !j.QueuedAt.IsZero() {
		return j.QueuedAt
	}
	return j.CreatedAt
}

// Project is a project: a bare git repository hosted by the coordinator
// and its pipelines.
type Project struct {
	ID int64
	// Path is the full path ("group/sub/name"), unique.
	Path          string
	Name          string
	Description   string
	DefaultBranch string
	// Visibility is private or public (see docs/pipelines.md for what a
	// job token may clone).
	Visibility string
	// MinIsolation is the weakest isolation level the project's jobs run
	// at (empty: none); see docs/isolation.md.
	MinIsolation string
	CreatedAt    time.Time
}

// Protects reports whether branch (a name, not refs/heads/…) is one of
// the project's protected refs: its default branch, as in GitLab's
// defaults (Berth has no other protection rules).
func (p *Project) Protects(branch string) bool {
	return branch != "" && branch == p.DefaultBranch
}

// RunAccess is the level a member needs to run pipelines of the project
// on ref (a branch or tag name, or refs/heads/…): ActAccess of whether it
// is protected.
func (p *Project) RunAccess(ref string) MemberAccess {
	return ActAccess(p.Protects(strings.TrimPrefix(ref, "refs/heads/")))
}

// Pipeline is one run of a project's CI configuration for a commit.
type Pipeline struct {
	ID        int64
	IID       int64 // per project, from 1
	ProjectID int64
	Ref       string // branch or tag name
	Tag       bool
	Sha       string
	BeforeSha string
	Source    string // push, api, web, ...
	Status    Status
	Protected bool
	// YAMLErrors holds the configuration errors of a pipeline that failed
	// to be created from its configuration (status failed).
	YAMLErrors    string
	FailureReason string
	CreatedAt     time.Time
	StartedAt     time.Time
	FinishedAt    time.Time
	UpdatedAt     time.Time

	// Downstream pipelines. UpstreamPipelineID is the pipeline whose
	// trigger job (bridge) SourceJobID created this one (0 for both: not
	// a downstream pipeline); a child pipeline's upstream is in the same
	// project (Source parent_pipeline), a multi-project one's in another
	// (Source pipeline). A bridge has at most one downstream pipeline:
	// the one with its id as SourceJobID. Variables are the pipeline
	// variables it was created with (the API's, or what a bridge passed
	// down), kept for forward:pipeline_variables.
	UpstreamPipelineID int64
	SourceJobID        int64
	Variables          []PipelineVariable
}

// PipelineVariable is a variable a pipeline was created with.
type PipelineVariable struct {
	Key   string `json:"key"`
	Value string `json:"value"`
	File  bool   `json:"file,omitempty"`
	// Raw: the runner does not expand the value (GitLab's raw pipeline
	// variables: TRIGGER_PAYLOAD).
	Raw bool `json:"raw,omitempty"`
}

// PipelineFilter selects pipelines for ListPipelines. Zero fields do not
// filter. Results are ordered by ID, newest first when Newest is set.
type PipelineFilter struct {
	ProjectID int64
	Statuses  []Status
	Ref       string
	Sha       string
	Newest    bool
	Limit     int
	Offset    int
	// UpstreamPipelineID selects the downstream pipelines of a pipeline;
	// SourceJobID the downstream pipeline of a bridge job.
	UpstreamPipelineID int64
	SourceJobID        int64
	// ScheduleID selects the pipelines a pipeline schedule created.
	ScheduleID int64
	// Source selects pipelines by CI_PIPELINE_SOURCE (push, schedule, …).
	Source string
}

// PipelineUpdate is applied by UpdatePipeline. Zero times are left
// unchanged; Status is always set.
type PipelineUpdate struct {
	Status     Status
	StartedAt  time.Time
	FinishedAt time.Time
	UpdatedAt  time.Time
	// ClearFinished clears FinishedAt (a retried pipeline runs again).
	ClearFinished bool
	// FailureReason and YAMLErrors, when not empty, replace the stored
	// ones (a pipeline that failed without jobs says why).
	FailureReason string
	YAMLErrors    string
}

// Variable is a project CI/CD variable.
type Variable struct {
	ProjectID int64
	Key       string
	Value     string
	// File: the runner writes the value to a file and the variable holds
	// its path (variable_type "file").
	File        bool
	Protected   bool // only jobs of protected refs get it
	Masked      bool // hidden in job logs
	Raw         bool // $ references in the value are not expanded
	Description string
}

// Artifact is the metadata of one stored artifact file of a job. The bytes
// live in an artifact storage under StorageKey.
type Artifact struct {
	ID         int64
	JobID      int64
	Type       string // archive, metadata, junit, ...
	Format     string // zip, gzip, raw, ...
	Filename   string
	Size       int64
	StorageKey string
	ExpireAt   time.Time // zero: never
	CreatedAt  time.Time
}

// TraceInfo describes a job's stored trace.
type TraceInfo struct {
	Size  int64
	CRC32 uint32 // IEEE CRC-32 of all stored bytes
	// ArchiveKey is the artifact storage key of the archived trace ("":
	// the trace is in the store).
	ArchiveKey string
}

// Store is the coordinator's persistence.
type Store interface {
	// Settings: small key/value pairs (e.g. the admin token digest).
	// GetSetting returns ErrNotFound for a missing key.
	GetSetting(ctx context.Context, key string) (string, error)
	PutSetting(ctx context.Context, key, value string) error

	// PutRegistrationToken stores t, replacing the token of the same scope.
	PutRegistrationToken(ctx context.Context, t RegistrationToken) error
	RegistrationTokenByDigest(ctx context.Context, digest string) (*RegistrationToken, error)

	// CreateRunner inserts r and sets r.ID. ErrExists if the token digest
	// is taken.
	CreateRunner(ctx context.Context, r *Runner) error
	GetRunner(ctx context.Context, id int64) (*Runner, error)
	RunnerByTokenDigest(ctx context.Context, digest string) (*Runner, error)
	ListRunners(ctx context.Context) ([]*Runner, error)
	// UpdateRunner writes every settable field of r (not the token fields,
	// not CreatedAt). ErrNotFound if r.ID does not exist.
	UpdateRunner(ctx context.Context, r *Runner) error
	// RotateRunnerToken replaces the token digest if it is still oldDigest,
	// else ErrConflict (a concurrent reset won).
	RotateRunnerToken(ctx context.Context, id int64, oldDigest, newDigest string, obtainedAt, expiresAt time.Time) error
	// DeleteRunner removes a runner and its managers. ErrNotFound if absent.
	DeleteRunner(ctx context.Context, id int64) error

	// UpsertRunnerManager creates or updates the manager (RunnerID,
	// SystemID) and sets m.ID and m.CreatedAt.
	UpsertRunnerManager(ctx context.Context, m *RunnerManager) error
	// ListRunnerManagers returns a runner's managers ordered by ID; with
	// runnerID 0, every runner's.
	ListRunnerManagers(ctx context.Context, runnerID int64) ([]*RunnerManager, error)
	// PutRunnerManagerFleet records the manager's fleet report (Fleet,
	// FleetReportedAt); ErrNotFound if the manager does not exist.
	PutRunnerManagerFleet(ctx context.Context, runnerID int64, systemID string, fleet []byte, at time.Time) error
	// DeleteRunnerManager removes one manager; ErrNotFound if absent.
	DeleteRunnerManager(ctx context.Context, runnerID int64, systemID string) error

	// CreateJob inserts j (Status must be Creatable; empty means pending)
	// and sets j.ID.
	CreateJob(ctx context.Context, j *Job) error
	// CreateJobs inserts jobs in one transaction (all or none), in order,
	// and sets their IDs; statuses as CreateJob.
	CreateJobs(ctx context.Context, jobs []*Job) error
	// RetryJob marks job oldID retried and inserts j, its replacement, in
	// one transaction, setting j.ID. ErrConflict if the old job is not
	// finished or was already retried; ErrNotFound if it does not exist.
	RetryJob(ctx context.Context, oldID int64, j *Job) error
	GetJob(ctx context.Context, id int64) (*Job, error)
	// JobByTokenDigest finds the job whose current assignment has this
	// token digest, whatever its status.
	JobByTokenDigest(ctx context.Context, digest string) (*Job, error)
	// ListJobs returns matching jobs ordered by ID.
	ListJobs(ctx context.Context, f JobFilter) ([]*Job, error)
	// AssignJob hands a pending, unassigned job to a manager; ErrConflict
	// if it is not pending or already assigned, ErrNotFound if absent,
	// ErrBusy if another transaction holds it (a store that skips locked
	// rows rather than waiting for them).
	AssignJob(ctx context.Context, a Assignment) error
	// UnassignJob returns a job that is still pending and assigned to
	// managerID to the queue (clears the assignment and token);
	// ErrConflict otherwise.
	UnassignJob(ctx context.Context, jobID, managerID int64) error
	// TransitionJob applies u if the job's status is one of from, and
	// returns the updated job; ErrConflict if not.
	TransitionJob(ctx context.Context, id int64, from []Status, u JobUpdate) (*Job, error)
	// TouchJob records a sign of life (UpdatedAt) of a job that is not
	// finished; ErrConflict if it is.
	TouchJob(ctx context.Context, id int64, at time.Time) error
	// MarkDebugTrace records that the job's log is a debug trace
	// (Job.DebugTrace); marking it again changes nothing. ErrNotFound if
	// there is no such job.
	MarkDebugTrace(ctx context.Context, id int64) error

	// AppendTrace appends data at offset, which must equal the current
	// size (else *RangeError with the current size), and returns the new
	// size. Durable when it returns. ErrTraceArchived if archived.
	AppendTrace(ctx context.Context, jobID, offset int64, data []byte) (int64, error)
	// ResetTrace discards the stored trace (trace_reset);
	// ErrTraceArchived if archived.
	ResetTrace(ctx context.Context, jobID int64) error
	TraceInfo(ctx context.Context, jobID int64) (TraceInfo, error)
	// ReadTrace writes the stored trace from offset on to w;
	// ErrTraceArchived if archived (nothing written).
	ReadTrace(ctx context.Context, jobID, offset int64, w io.Writer) (int64, error)
	// TracesToArchive lists, oldest first and at most limit (<= 0: all),
	// the jobs finished before the given time whose non-empty trace is
	// still in the store.
	TracesToArchive(ctx context.Context, finishedBefore time.Time, limit int) ([]int64, error)
	// ArchiveTrace records that the job's trace, as it was when size bytes
	// long, is stored under key in the artifact storage, and drops it
	// from the store. *RangeError if the trace is no longer size bytes
	// long (an append came in: archive it again later), ErrTraceArchived
	// if it already is archived, ErrNotFound without a trace.
	ArchiveTrace(ctx context.Context, jobID, size int64, key string) error
	// UnarchiveTrace brings an archived trace back into the store, so it
	// can grow again: data must be the object under key, matching the
	// trace's size and CRC. ErrConflict if the trace is not (or no longer)
	// archived under key; an error if data does not match.
	UnarchiveTrace(ctx context.Context, jobID int64, key string, data []byte) error

	// PutArtifact records a, replacing the job's artifact of the same Type,
	// and sets a.ID. It returns the replaced artifact (nil if none) so its
	// bytes can be deleted.
	PutArtifact(ctx context.Context, a *Artifact) (replaced *Artifact, err error)
	ListArtifacts(ctx context.Context, jobID int64) ([]*Artifact, error)
	// ArtifactsOfType lists every job's artifacts of one type, expired or
	// not, ordered by ID.
	ArtifactsOfType(ctx context.Context, typ string) ([]*Artifact, error)
	// ExpiredArtifacts lists artifacts with a non-zero ExpireAt before t.
	ExpiredArtifacts(ctx context.Context, before time.Time, limit int) ([]*Artifact, error)
	DeleteArtifact(ctx context.Context, id int64) error

	// CreateProject inserts p and sets p.ID; ErrExists if the path is
	// taken.
	CreateProject(ctx context.Context, p *Project) error
	GetProject(ctx context.Context, id int64) (*Project, error)
	ProjectByPath(ctx context.Context, path string) (*Project, error)
	ListProjects(ctx context.Context) ([]*Project, error)
	// UpdateProject writes Name, Description, DefaultBranch, Visibility
	// and MinIsolation of project p.ID (not its Path or CreatedAt);
	// ErrNotFound if it does not exist.
	UpdateProject(ctx context.Context, p *Project) error

	// CreatePipeline inserts p, sets p.ID and p.IID (the project's next);
	// ErrNotFound if the project does not exist.
	CreatePipeline(ctx context.Context, p *Pipeline) error
	GetPipeline(ctx context.Context, id int64) (*Pipeline, error)
	ListPipelines(ctx context.Context, f PipelineFilter) ([]*Pipeline, error)
	// UpdatePipeline applies u and returns the pipeline; ErrNotFound if
	// absent.
	UpdatePipeline(ctx context.Context, id int64, u PipelineUpdate) (*Pipeline, error)
	// DeletePipeline removes a pipeline and its jobs in one transaction,
	// and with the jobs their logs, artifact records and deployments (not
	// Pages deployments, which outlive their job). Objects the records
	// name (artifacts, archived logs) are the caller's to delete first.
	// ErrNotFound if the pipeline does not exist.
	DeletePipeline(ctx context.Context, id int64) error

	// CreateVariable inserts v; ErrExists if the project has the key,
	// ErrNotFound if the project does not exist.
	CreateVariable(ctx context.Context, v *Variable) error
	// UpdateVariable replaces the variable (ProjectID, Key); ErrNotFound
	// if absent.
	UpdateVariable(ctx context.Context, v *Variable) error
	GetVariable(ctx context.Context, projectID int64, key string) (*Variable, error)
	// ListVariables returns a project's variables ordered by key.
	ListVariables(ctx context.Context, projectID int64) ([]*Variable, error)
	// DeleteVariable removes a variable; ErrNotFound if absent.
	DeleteVariable(ctx context.Context, projectID int64, key string) error

	// Pipeline schedules (schedules.go).
	//
	// CreatePipelineSchedule inserts s and sets s.ID and s.Version;
	// ErrNotFound if the project does not exist.
	CreatePipelineSchedule(ctx context.Context, s *PipelineSchedule) error
	GetPipelineSchedule(ctx context.Context, id int64) (*PipelineSchedule, error)
	// ListPipelineSchedules returns a project's schedules ordered by ID.
	ListPipelineSchedules(ctx context.Context, projectID int64) ([]*PipelineSchedule, error)
	// UpdatePipelineSchedule writes every field of s.ID but its project,
	// CreatedAt and LastPipelineID, if it is still at s.Version, and sets
	// s.Version to the new one; ErrConflict if it was changed meanwhile,
	// ErrNotFound if absent.
	UpdatePipelineSchedule(ctx context.Context, s *PipelineSchedule) error
	// DeletePipelineSchedule removes a schedule (not its pipelines);
	// ErrNotFound if absent.
	DeletePipelineSchedule(ctx context.Context, id int64) error
	// DuePipelineSchedules lists active schedules whose non-zero NextRunAt
	// is not after t, soonest first.
	DuePipelineSchedules(ctx context.Context, t time.Time, limit int) ([]*PipelineSchedule, error)
	// AddSchedulePipeline records that a schedule created a pipeline
	// (PipelineFilter.ScheduleID); ErrNotFound if either is gone.
	AddSchedulePipeline(ctx context.Context, scheduleID, pipelineID int64) error

	// Pipeline trigger tokens (triggers.go).
	//
	// CreatePipelineTrigger inserts t and sets t.ID; ErrExists if the
	// digest is taken, ErrNotFound if the project does not exist.
	CreatePipelineTrigger(ctx context.Context, t *PipelineTrigger) error
	GetPipelineTrigger(ctx context.Context, id int64) (*PipelineTrigger, error)
	// PipelineTriggerByDigest finds a trigger by its token's digest; an
	// empty digest never matches.
	PipelineTriggerByDigest(ctx context.Context, digest string) (*PipelineTrigger, error)
	// ListPipelineTriggers returns a project's triggers ordered by ID.
	ListPipelineTriggers(ctx context.Context, projectID int64) ([]*PipelineTrigger, error)
	// UpdatePipelineTrigger writes Description, OwnerID and UpdatedAt of
	// t.ID; ErrNotFound if absent.
	UpdatePipelineTrigger(ctx context.Context, t *PipelineTrigger) error
	// TouchPipelineTrigger sets a trigger's LastUsed; ErrNotFound if
	// absent.
	TouchPipelineTrigger(ctx context.Context, id int64, at time.Time) error
	// DeletePipelineTrigger removes a trigger; ErrNotFound if absent.
	DeletePipelineTrigger(ctx context.Context, id int64) error

	// Environments, deployments, releases and GitLab Pages (deploy.go).
	//
	// EnsureEnvironment returns the project's environment named e.Name,
	// creating it from e when there is none (then created is true); e is
	// set to the stored environment. ErrNotFound if the project does not
	// exist.
	EnsureEnvironment(ctx context.Context, e *Environment) (created bool, err error)
	GetEnvironment(ctx context.Context, id int64) (*Environment, error)
	// ListEnvironments returns a project's environments ordered by ID.
	ListEnvironments(ctx context.Context, projectID int64) ([]*Environment, error)
	// UpdateEnvironment writes ExternalURL, Tier, State, AutoStopAt and
	// UpdatedAt of e.ID; ErrNotFound if absent.
	UpdateEnvironment(ctx context.Context, e *Environment) error
	// DueEnvironments lists available environments whose non-zero
	// AutoStopAt is before t, soonest first.
	DueEnvironments(ctx context.Context, before time.Time, limit int) ([]*Environment, error)
	// CreateDeployment inserts d and sets d.ID and d.IID (the project's
	// next). ErrExists if the job has a deployment; ErrNotFound if the
	// project, environment or job does not exist.
	CreateDeployment(ctx context.Context, d *Deployment) error
	// UpdateDeployment applies u and returns the deployment; ErrNotFound
	// if absent.
	UpdateDeployment(ctx context.Context, id int64, u DeploymentUpdate) (*Deployment, error)
	// ListDeployments returns matching deployments ordered by ID.
	ListDeployments(ctx context.Context, f DeploymentFilter) ([]*Deployment, error)
	// CreateRelease inserts r and sets r.ID; ErrExists if the project has
	// a release of the tag, ErrNotFound if the project does not exist.
	CreateRelease(ctx context.Context, r *Release) error
	// GetRelease returns a project's release of a tag.
	GetRelease(ctx context.Context, projectID int64, tag string) (*Release, error)
	// ListReleases returns a project's releases, newest ReleasedAt first
	// (then highest ID).
	ListReleases(ctx context.Context, projectID int64) ([]*Release, error)
	// PutPagesDeployment records d, replacing the project's deployment of
	// the same PathPrefix in the same transaction, and sets d.ID. It
	// returns the replaced deployment (nil if none) so its files can be
	// removed. ErrNotFound if the project or job does not exist.
	PutPagesDeployment(ctx context.Context, d *PagesDeployment) (replaced *PagesDeployment, err error)
	// ListPagesDeployments returns a project's deployments ordered by ID.
	ListPagesDeployments(ctx context.Context, projectID int64) ([]*PagesDeployment, error)
	// ExpiredPagesDeployments lists deployments with a non-zero ExpireAt
	// before t, soonest first.
	ExpiredPagesDeployments(ctx context.Context, before time.Time, limit int) ([]*PagesDeployment, error)
	// DeletePagesDeployment removes one; ErrNotFound if absent.
	DeletePagesDeployment(ctx context.Context, id int64) error

	// Users and their web sessions (users.go).
	//
	// CreateUser inserts u and sets u.ID; ErrExists if the name or the
	// token digest is taken.
	CreateUser(ctx context.Context, u *User) error
	GetUser(ctx context.Context, id int64) (*User, error)
	UserByTokenDigest(ctx context.Context, digest string) (*User, error)
	// ListUsers returns every user ordered by ID.
	ListUsers(ctx context.Context) ([]*User, error)
	// DeleteUser removes a user, its sessions and its project
	// memberships; ErrNotFound if absent.
	DeleteUser(ctx context.Context, id int64) error
	// GetProjectMember returns a user's membership of a project;
	// ErrNotFound if not a member.
	GetProjectMember(ctx context.Context, projectID, userID int64) (*ProjectMember, error)
	// ListProjectMembers returns a project's members ordered by user ID.
	ListProjectMembers(ctx context.Context, projectID int64) ([]*ProjectMember, error)
	// MembershipsOfUser returns a user's memberships ordered by project ID.
	MembershipsOfUser(ctx context.Context, userID int64) ([]*ProjectMember, error)
	// ChangeProjectMember adds, changes or removes a membership if it is
	// still as c.From says (ErrConflict otherwise, ErrNotFound when the
	// member, the project or the user is gone), and with c.KeepOwner not
	// if the project would lose its last owner (ErrLastOwner): one
	// decision however many requests change members at once.
	ChangeProjectMember(ctx context.Context, c MemberChange) error
	// CreateSession inserts a session; ErrExists if its digest is taken,
	// ErrNotFound if its user (not 0) does not exist.
	CreateSession(ctx context.Context, s *Session) error
	// GetSession returns the session of a digest, expired or not.
	GetSession(ctx context.Context, digest string) (*Session, error)
	// DeleteSession removes a session; ErrNotFound if absent.
	DeleteSession(ctx context.Context, digest string) error
	// DeleteExpiredSessions removes the sessions that expired before t
	// and returns how many.
	DeleteExpiredSessions(ctx context.Context, before time.Time) (int, error)

	// Close releases resources; in-flight calls may fail afterwards.
	Close() error
}

// ArtifactsOf lists the artifacts of each job of ids, by job.
func ArtifactsOf(ctx context.Context, st Store, ids []int64) (map[int64][]*Artifact, error) {
	out := make(map[int64][]*Artifact, len(ids))
	for _, id := range ids {
		arts, err := st.ListArtifacts(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("loading artifacts of job %d: %w", id, err)
		}
		out[id] = arts
	}
	return out, nil
}
