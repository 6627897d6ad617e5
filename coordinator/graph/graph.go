// Package graph is what a pipeline's job knows of its place in the
// pipeline (stage, needs, when, retry, environment, release, Pages, the
// trigger of a bridge), stored with the job as its opaque store.Job.Graph,
// and the pure functions the pipeline engine decides with: the composite
// status of a group of jobs, what runs next (Plan), automatic retries, and
// the jobs downstream of one. Nothing here reads a store or a clock.
package graph

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// Bridge is what a trigger job needs to create its downstream
// pipeline.
type Bridge struct {
	Trigger ci.Trigger `json:"trigger"`
	// YAMLVariables are the bridge's YAML variables (global, job,
	// matrix and rules), forwarded with forward:yaml_variables.
	YAMLVariables []ci.Variable `json:"yaml_variables,omitempty"`
	// Variables are every variable the bridge sees, as a job of its
	// pipeline would get them (predefined, YAML, project, pipeline):
	// they expand trigger:project, trigger:branch and the forwarded
	// YAML variables.
	Variables []runnerapi.Variable `json:"variables,omitempty"`
	// HighVariables is how many of the last Variables are the project's
	// and the pipeline's, which win over the dependencies' dotenv
	// variables (0 for bridges stored before: dotenv ones win).
	HighVariables int `json:"high_variables,omitempty"`
}

// IsBridge reports whether a stored job is a trigger job (a bridge): it
// never runs on a runner; its downstream pipeline is the one whose
// SourceJobID is its id.
func IsBridge(j *store.Job) bool { return Decode(j.Graph).Bridge != nil }

// Job is what the pipeline engine knows about a job of a pipeline,
// stored as the job's opaque store.Job.Graph. It comes from the compiled
// configuration (ci.Job) and does not change after creation, except on
// the copy a retry makes.
type Job struct {
	StageIndex int `json:"stage_index"`
	// DAG: the job waits for its needs only (needs: [] included), not
	// for earlier stages.
	DAG   bool   `json:"dag,omitempty"`
	Needs []Need `json:"needs,omitempty"`
	// Dependencies name the jobs whose artifacts the job downloads; they
	// become job ids when the job is enqueued.
	Dependencies []string `json:"dependencies,omitempty"`
	// CrossNeeds are needs:pipeline and needs:project (pipelines/crossneeds.go).
	CrossNeeds            []CrossNeed `json:"cross_needs,omitempty"`
	When                  string      `json:"when"`
	StartInSeconds        int64       `json:"start_in_seconds,omitempty"`
	AllowFailure          bool        `json:"allow_failure,omitempty"`
	AllowFailureExitCodes []int       `json:"allow_failure_exit_codes,omitempty"`
	RetryMax              int         `json:"retry_max,omitempty"`
	RetryWhen             []string    `json:"retry_when,omitempty"`
	RetryExitCodes        []int       `json:"retry_exit_codes,omitempty"`
	ResourceGroup         string      `json:"resource_group,omitempty"`
	Interruptible         bool        `json:"interruptible,omitempty"`
	Environment           string      `json:"environment,omitempty"`
	// Env, Release and Pages are the job's environment (expanded),
	// release and Pages keywords (pipelines/deploy.go, pipelines/release.go,
	// coordinator/pages).
	Env     *Env        `json:"env,omitempty"`
	Release *ci.Release `json:"release,omitempty"`
	Pages   *Pages      `json:"pages,omitempty"`
	// Immediate: a retried job is enqueued as soon as its needs allow,
	// even when it is manual or delayed (GitLab's enqueue_immediately).
	Immediate bool `json:"immediate,omitempty"`
	// Bridge is set on a trigger job: it is never queued for runners;
	// when its turn comes the engine creates its downstream pipeline
	// (pipelines/downstream.go).
	Bridge *Bridge `json:"bridge,omitempty"`
}

type Need struct {
	Job       string `json:"job"`
	Artifacts bool   `json:"artifacts,omitempty"`
}

// Decode reads a job's graph; jobs outside pipelines (or with a
// damaged graph) get the zero graph: on_success, stage 0.
func Decode(b []byte) Job {
	var g Job
	if len(b) > 0 {
		_ = json.Unmarshal(b, &g)
	}
	if g.When == "" {
		g.When = "on_success"
	}
	return g
}

// Node is the engine's view of one job: the pure scheduling functions work
// on nodes, not on the store.
type Node struct {
	ID            int64
	Name          string
	Status        store.Status
	Retried       bool
	ExitCode      int
	FailureReason string
	ScheduledAt   time.Time
	Graph         Job
}

func NodeOf(j *store.Job) *Node {
	return &Node{ID: j.ID, Name: j.Name, Status: j.Status, Retried: j.Retried, ExitCode: j.ExitCode,
		FailureReason: j.FailureReason, ScheduledAt: j.ScheduledAt, Graph: Decode(j.Graph)}
}

// AllowedToFail reports whether a job's failure does not fail its
// pipeline: allow_failure, or allow_failure:exit_codes matching its exit
// code (for summaries such as berth run's).
func AllowedToFail(j *store.Job) bool { return NodeOf(j).AllowedToFail() }

// allowedToFail reports whether n's failure does not fail the pipeline:
// allow_failure, or allow_failure:exit_codes matching its exit code.
func (n *Node) AllowedToFail() bool {
	if n.Graph.AllowFailure {
		return true
	}
	return n.Status == store.StatusFailed && n.ExitCode != 0 && slices.Contains(n.Graph.AllowFailureExitCodes, n.ExitCode)
}

// CompositeStatus computes the status of a group of jobs as GitLab's
// Gitlab::Ci::Status::Composite does: failed and canceled jobs allowed to
// fail count as warnings and, like manual jobs allowed to fail, are left
// out of the calculation. It returns "" for an empty group.
func CompositeStatus(nodes []*Node) (status store.Status, warnings bool) {
	if len(nodes) == 0 {
		return "", false
	}
	set := map[store.Status]bool{}
	for _, n := range nodes {
		af := n.AllowedToFail()
		if af && (n.Status == store.StatusFailed || n.Status == store.StatusCanceled) {
			warnings = true
		}
		if af && (n.Status == store.StatusManual || n.Status == store.StatusFailed || n.Status == store.StatusCanceled) {
			continue
		}
		set[n.Status] = true
	}
	only := func(sts ...store.Status) bool {
		m := 0
		for _, s := range sts {
			if set[s] {
				m++
			}
		}
		return m == len(set)
	}
	any := func(sts ...store.Status) bool {
		for _, s := range sts {
			if set[s] {
				return true
			}
		}
		return false
	}
	switch {
	case len(set) == 0 || only(store.StatusSkipped):
		if warnings {
			return store.StatusSuccess, true
		}
		return store.StatusSkipped, false
	case only(store.StatusSuccess, store.StatusSkipped):
		return store.StatusSuccess, warnings
	case only(store.StatusCreated):
		return store.StatusCreated, warnings
	case only(store.StatusSuccess, store.StatusSkipped, store.StatusCanceled):
		return store.StatusCanceled, warnings
	case any(store.StatusCanceling):
		return store.StatusCanceling, warnings
	case only(store.StatusCreated, store.StatusSkipped, store.StatusPending):
		return store.StatusPending, warnings
	case any(store.StatusRunning, store.StatusPending):
		return store.StatusRunning, warnings
	case any(store.StatusWaitingForResource):
		return store.StatusWaitingForResource, warnings
	case any(store.StatusManual):
		return store.StatusManual, warnings
	case any(store.StatusScheduled):
		return store.StatusScheduled, warnings
	case any(store.StatusCreated):
		return store.StatusRunning, warnings
	default:
		return store.StatusFailed, warnings
	}
}

// completed are the statuses after which a job's dependents are decided.
func completed(s store.Status) bool {
	switch s {
	case store.StatusSuccess, store.StatusFailed, store.StatusCanceled, store.StatusSkipped:
		return true
	}
	return false
}

// ActionKind is what the engine does with a job.
type ActionKind string

const (
	ActEnqueue  ActionKind = "enqueue"  // → pending (or waiting_for_resource)
	ActManual   ActionKind = "manual"   // → manual
	ActSchedule ActionKind = "schedule" // → scheduled at At
	ActSkip     ActionKind = "skip"     // → skipped
)

type Action struct {
	ID   int64
	Kind ActionKind
	At   time.Time // ActSchedule: when the job becomes pending
}

// validPrevious are the statuses of a job's predecessors under which it
// runs (GitLab's Ci::ProcessBuildService); under any other Completed
// status it is skipped.
func validPrevious(g Job, prev store.Status) bool {
	switch g.When {
	case "on_success", "manual", "delayed":
		if g.DAG {
			return prev == store.StatusSuccess
		}
		return prev == store.StatusSuccess || prev == store.StatusSkipped
	case "on_failure":
		return prev == store.StatusFailed
	case "always":
		return prev == store.StatusSuccess || prev == store.StatusFailed || prev == store.StatusSkipped
	}
	return false
}

// Plan decides what happens next to the jobs of a pipeline: each created
// job whose predecessors (its needs for a DAG job, every job of earlier
// stages otherwise) are all Completed is enqueued, made manual, scheduled
// or skipped, following its when and their composite status; a scheduled
// job whose time has come is enqueued. Decisions feed back (a skipped job
// can decide the next stage) until nothing changes. Only the latest job of
// each name counts; retried jobs are ignored. Plan is pure: the engine
// applies its actions.
func Plan(jobs []*Node, now time.Time) []Action {
	var latest []*Node
	byName := map[string]*Node{}
	for _, n := range jobs {
		if n.Retried {
			continue
		}
		c := *n
		latest = append(latest, &c)
		byName[n.Name] = &c
	}
	slices.SortStableFunc(latest, func(a, b *Node) int {
		if a.Graph.StageIndex != b.Graph.StageIndex {
			return a.Graph.StageIndex - b.Graph.StageIndex
		}
		return int(a.ID - b.ID)
	})
	var out []Action
	for _, n := range latest {
		if n.Status == store.StatusScheduled && !n.ScheduledAt.IsZero() && !now.Before(n.ScheduledAt) {
			out = append(out, Action{ID: n.ID, Kind: ActEnqueue})
			n.Status = store.StatusPending
		}
	}
	for changed := true; changed; {
		changed = false
		for _, n := range latest {
			if n.Status != store.StatusCreated {
				continue
			}
			var prev []*Node
			if n.Graph.DAG {
				for _, nd := range n.Graph.Needs {
					if p := byName[nd.Job]; p != nil && p != n {
						prev = append(prev, p)
					}
				}
			} else {
				for _, p := range latest {
					if p.Graph.StageIndex < n.Graph.StageIndex {
						prev = append(prev, p)
					}
				}
			}
			st, _ := CompositeStatus(prev)
			if st == "" {
				st = store.StatusSuccess
			}
			if !completed(st) {
				continue
			}
			a := Action{ID: n.ID}
			switch {
			case !validPrevious(n.Graph, st):
				a.Kind, n.Status = ActSkip, store.StatusSkipped
			case n.Graph.When == "manual" && !n.Graph.Immediate:
				a.Kind, n.Status = ActManual, store.StatusManual
			case n.Graph.When == "delayed" && !n.Graph.Immediate:
				a.Kind, n.Status = ActSchedule, store.StatusScheduled
				a.At = now.Add(time.Duration(n.Graph.StartInSeconds) * time.Second)
			default:
				a.Kind, n.Status = ActEnqueue, store.StatusPending
			}
			out = append(out, a)
			changed = true
		}
	}
	return out
}

// noRetryReasons are failure reasons GitLab never retries automatically.
var noRetryReasons = map[string]bool{
	"ci_quota_exceeded": true, "no_matching_runner": true, "missing_dependency_failure": true,
	"forward_deployment_failure": true, "environment_creation_failure": true,
}

// retryUmbrella maps the failure reasons GitLab 19.1 split out of an
// older one to it: retry:when naming the older one still retries them.
var retryUmbrella = map[string]string{
	"stuck_pending_with_matching_runners": "stuck_or_timeout_failure",
	"stuck_pending_no_matching_runners":   "stuck_or_timeout_failure",
	"no_updates_running":                  "stuck_or_timeout_failure",
	"no_updates_canceling":                "stuck_or_timeout_failure",
	"server_timeout_running":              "job_execution_timeout",
	"server_timeout_canceling":            "job_execution_timeout",
}

// AutoRetry reports whether a failed job is retried automatically, as
// GitLab's Gitlab::Ci::Build::AutoRetry decides: retries left (retries
// counts earlier retries of the job's name in the pipeline), and its
// failure reason in retry:when (default always, unless retry:exit_codes is
// given) or its exit code in retry:exit_codes.
func AutoRetry(n *Node, retries int) bool {
	if n.Status != store.StatusFailed || n.Retried || noRetryReasons[n.FailureReason] {
		return false
	}
	g := n.Graph
	when := g.RetryWhen
	if when == nil && g.RetryExitCodes == nil {
		when = []string{"always"}
	}
	byReason := slices.Contains(when, "always") || slices.Contains(when, n.FailureReason) ||
		slices.Contains(when, retryUmbrella[n.FailureReason])
	byExitCode := n.ExitCode != 0 && slices.Contains(g.RetryExitCodes, n.ExitCode)
	max := 0
	if byReason || byExitCode {
		max = g.RetryMax
	}
	if n.FailureReason == "scheduler_failure" && max == 0 {
		max = 2 // GitLab's default for scheduler failures
	}
	return max > 0 && retries < max
}

// Downstream returns the latest jobs that wait on job (directly or
// through others): DAG jobs needing it, stage jobs of later stages. A
// retry resets the skipped ones among them to created (GitLab's
// ResetSkippedJobsService), so they run once the retry succeeds.
func Downstream(jobs []*Node, job *Node) []*Node {
	var latest []*Node
	for _, n := range jobs {
		if !n.Retried && n.ID != job.ID {
			latest = append(latest, n)
		}
	}
	in := map[string]bool{job.Name: true}
	minStage := job.Graph.StageIndex // lowest stage of a job in the set
	var out []*Node
	for changed := true; changed; {
		changed = false
		for _, n := range latest {
			if in[n.Name] {
				continue
			}
			hit := false
			if n.Graph.DAG {
				for _, nd := range n.Graph.Needs {
					hit = hit || in[nd.Job]
				}
			} else {
				hit = n.Graph.StageIndex > minStage
			}
			if hit {
				in[n.Name] = true
				out = append(out, n)
				minStage = min(minStage, n.Graph.StageIndex)
				changed = true
			}
		}
	}
	slices.SortFunc(out, func(a, b *Node) int { return int(a.ID - b.ID) })
	return out
}

// Env is what the engine needs of a job's environment keyword, with
// variables expanded at pipeline creation (as GitLab expands the name).
type Env struct {
	Name       string `json:"name"`
	Slug       string `json:"slug"`
	URL        string `json:"url,omitempty"`
	Action     string `json:"action"`
	Tier       string `json:"tier"`
	TierSet    bool   `json:"tier_set,omitempty"` // deployment_tier was written
	OnStop     string `json:"on_stop,omitempty"`
	AutoStopIn string `json:"auto_stop_in,omitempty"`
}

// deploys reports whether the job deploys (creates a deployment).
func (e *Env) Deploys() bool { return e != nil && (e.Action == "" || e.Action == "start") }

// Pages is what a Pages job publishes, prefix expanded and slugged at
// pipeline creation.
type Pages struct {
	Publish    string `json:"publish"`
	PathPrefix string `json:"path_prefix,omitempty"`
	ExpireIn   string `json:"expire_in,omitempty"`
}

// CrossNeed is a cross need with its values expanded at pipeline
// creation (with the job's variables, so $PARENT_PIPELINE_ID works).
type CrossNeed struct {
	// OnPipeline: needs:pipeline (Pipeline, expanded, should be an id);
	// else needs:project (Project, Ref).
	OnPipeline bool   `json:"on_pipeline,omitempty"`
	Pipeline   string `json:"pipeline,omitempty"`
	Project    string `json:"project,omitempty"`
	Ref        string `json:"ref,omitempty"`
	Job        string `json:"job"`
	Artifacts  bool   `json:"artifacts,omitempty"`
}
