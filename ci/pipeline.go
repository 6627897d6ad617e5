package ci

import (
	"context"
	"encoding/json"
	"io/fs"
	"time"

	"github.com/berthci/berth/executor"
)

// Source names the CI configuration to compile: Path inside FS. Local
// includes are read from the same FS, relative to its root, which is the
// repository root. The coordinator passes an fs.FS backed by a git commit;
// berth ci lint passes os.DirFS of the working tree.
type Source struct {
	FS   fs.FS
	Path string // default ".gitlab-ci.yml"
}

// Env is everything outside the YAML that decides the pipeline's shape.
type Env struct {
	// Predefined holds the predefined CI_* variables (CI_COMMIT_BRANCH,
	// CI_PIPELINE_SOURCE, ...). They have the lowest precedence: YAML
	// variables override them, as in GitLab.
	Predefined map[string]string
	// Variables holds project, group, instance, trigger and manual pipeline
	// variables. They have the highest precedence and override YAML
	// variables in rules expressions.
	Variables map[string]string
	// Changes answers rules:changes. Nil means there is no diff to compare
	// with (a new branch, a tag, a schedule), where GitLab evaluates changes
	// to true.
	Changes ChangesFunc
	// Exists answers rules:exists. Nil means no file exists.
	Exists ExistsFunc
	// ExistsIn answers rules:exists with project (and ref: "" means the
	// project's default branch). Nil means no file exists there; so does
	// a project the pipeline may not read.
	ExistsIn ExistsInFunc
	// CacheKey computes the key of a cache:key:files entry. Nil leaves
	// Cache.Key empty and Cache.KeyFiles set for the caller to resolve.
	CacheKey CacheKeyFunc
	// Includes resolves include:project, include:remote, include:template
	// and include:component. Nil makes them configuration errors.
	Includes IncludeResolver
	// Inputs are the pipeline's inputs, for a spec:inputs header of the
	// main configuration file. Values are strings (text, read as the
	// input's declared type: "3", "true", "[a, b]"), bool, int, int64,
	// float64, []string, []any or map[string]any.
	Inputs map[string]any
	// Limits bound the work done on hostile input; zero fields take the
	// defaults.
	Limits Limits
}

// ChangesFunc reports whether any file matching one of the glob patterns
// changed, compared with CompareTo (a ref; empty means the push's before
// commit or the merge request's target). Globs follow MatchGlob.
type ChangesFunc func(ctx context.Context, q ChangesQuery) (bool, error)

// ChangesQuery is one rules:changes clause, variables already expanded.
type ChangesQuery struct {
	Paths     []string
	CompareTo string
}

// ExistsFunc reports whether any file of the commit matches one of the
// glob patterns (MatchGlob syntax).
type ExistsFunc func(ctx context.Context, patterns []string) (bool, error)

// ExistsInFunc reports whether any file of another project at ref matches
// one of the glob patterns.
type ExistsInFunc func(ctx context.Context, project, ref string, patterns []string) (bool, error)

// CacheKeyFunc returns the digest GitLab computes for cache:key:files (of
// the files' contents, FilesCacheKey) or, with commits, for
// cache:key:files_commits (of the last commits that changed them,
// CommitsCacheKey); "" when none of the files exists (the key is then
// "default", with the prefix if any).
type CacheKeyFunc func(ctx context.Context, files []string, commits bool) (string, error)

// Limits bound parsing work.
type Limits struct {
	MaxFileBytes int // per file; default 1 MiB (GitLab's max_yaml_size_bytes)
	MaxDepth     int // YAML nesting; default 100 (GitLab's max_yaml_depth)
	MaxIncludes  int // default 150, as GitLab
	MaxNodes     int // values after aliases and references; default 1,000,000
	// MaxJobs bounds the jobs a pipeline creates (after rules, GitLab's
	// ci_pipeline_size); default 2,000. A configuration may define up to
	// 5 × MaxJobs (after parallel expansion, before rules): GitLab's own
	// defines more than 2,000 and creates fewer.
	MaxJobs int
	// MaxNeeds bounds needs per job; default 1,000. GitLab's default
	// (ci_max_needs, 50) is a plan limit self-managed instances raise:
	// more than 50 warns.
	MaxNeeds int
}

func (l Limits) maxDefinedJobs() int { return 5 * l.MaxJobs }

func (l Limits) withDefaults() Limits {
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = 1 << 20
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = 100
	}
	if l.MaxIncludes <= 0 {
		l.MaxIncludes = 150
	}
	if l.MaxNodes <= 0 {
		l.MaxNodes = 1_000_000
	}
	if l.MaxJobs <= 0 {
		l.MaxJobs = 2000
	}
	if l.MaxNeeds <= 0 {
		l.MaxNeeds = 1000
	}
	return l
}

// Pipeline is a compiled configuration for one ref and set of variables.
type Pipeline struct {
	// Created is false when workflow:rules prevent the pipeline, or when
	// no job (outside .pre and .post) is left after rules; Reason says why.
	Created bool   `json:"created"`
	Reason  string `json:"reason,omitempty"`
	// Name is workflow:name, unexpanded.
	Name string `json:"name,omitempty"`
	// WorkflowRule is the index of the workflow rule that matched, or -1.
	WorkflowRule int `json:"workflow_rule"`
	// Stages in order, with .pre first and .post last.
	Stages []string `json:"stages"`
	// Variables are the global YAML variables with workflow rules
	// variables applied; descriptions and options prefill manual pipelines.
	Variables []Variable `json:"variables,omitempty"`
	// Jobs in the pipeline, ordered by stage, then by position in the
	// configuration; parallel instances in index order.
	Jobs []*Job `json:"jobs"`
	// Excluded are the jobs rules kept out of the pipeline (When is never).
	Excluded []*Job `json:"excluded,omitempty"`
	// Warnings do not stop the pipeline.
	Warnings []Warning `json:"warnings,omitempty"`
}

// Job returns the job with the given (expanded) name, or nil.
func (p *Pipeline) Job(name string) *Job {
	for _, j := range p.Jobs {
		if j.Name == name {
			return j
		}
	}
	return nil
}

// When is when a job runs.
type When string

// The values of when. Never appears only on excluded jobs.
const (
	OnSuccess When = "on_success"
	OnFailure When = "on_failure"
	Always    When = "always"
	Manual    When = "manual"
	Delayed   When = "delayed"
	Never     When = "never"
)

// Scheduling says how a job waits: for whole earlier stages, or only for
// its needs (a DAG job, also with needs: []).
type Scheduling string

// The two scheduling types, named as in GitLab.
const (
	ScheduleStage Scheduling = "stage"
	ScheduleDAG   Scheduling = "dag"
)

// Job is one job of the pipeline, with every keyword resolved: defaults
// applied, extends merged, references replaced, parallel expanded and rules
// evaluated.
type Job struct {
	Name       string `json:"name"`
	BaseName   string `json:"base_name"` // the name in the YAML, before parallel expansion
	Pos        Pos    `json:"pos"`
	Stage      string `json:"stage"`
	StageIndex int    `json:"stage_index"`

	Image               *Image     `json:"image,omitempty"`
	Services            []Image    `json:"services,omitempty"`
	BeforeScript        []string   `json:"before_script,omitempty"`
	Script              []string   `json:"script"`
	AfterScript         []string   `json:"after_script,omitempty"`
	PreGetSourcesScript []string   `json:"pre_get_sources_script,omitempty"`
	Tags                []string   `json:"tags,omitempty"`
	Variables           []Variable `json:"variables,omitempty"`

	Scheduling Scheduling `json:"scheduling"`
	// Needs are resolved to expanded job names and to the jobs in the
	// pipeline (optional needs on absent jobs are dropped).
	Needs []Need `json:"needs,omitempty"`
	// Dependencies are the jobs whose artifacts this job downloads: the
	// dependencies keyword, else needs with artifacts, else every job of
	// earlier stages. A trigger job downloads nothing; its dependencies'
	// dotenv variables expand its variables and trigger fields.
	Dependencies []string `json:"dependencies,omitempty"`
	// CrossNeeds are needs:pipeline and needs:project: artifacts from a
	// job of another pipeline or project.
	CrossNeeds []CrossNeed `json:"cross_needs,omitempty"`

	Artifacts *Artifacts `json:"artifacts,omitempty"`
	Cache     []Cache    `json:"cache,omitempty"`

	// Timeout is the job's own timeout; zero means the project's.
	Timeout               time.Duration `json:"-"`
	Retry                 Retry         `json:"retry"`
	When                  When          `json:"when"`
	StartIn               time.Duration `json:"-"`
	AllowFailure          bool          `json:"allow_failure"`
	AllowFailureExitCodes []int         `json:"allow_failure_exit_codes,omitempty"`
	Interruptible         bool          `json:"interruptible"`
	ResourceGroup         string        `json:"resource_group,omitempty"`
	Environment           *Environment  `json:"environment,omitempty"`
	Coverage              string        `json:"coverage,omitempty"`
	// Release is the release keyword: the coordinator creates the release
	// when the job succeeds (docs/ci-yaml.md).
	Release *Release `json:"release,omitempty"`
	// Pages is set on a GitLab Pages job (the pages keyword, the
	// deprecated publish, or a job named pages): its publish directory is
	// deployed when it succeeds.
	Pages *Pages `json:"pages,omitempty"`

	// Trigger is set on a trigger job (a bridge): it has no script and
	// never runs on a runner; the coordinator creates its downstream
	// pipeline instead.
	Trigger *Trigger `json:"trigger,omitempty"`

	// IDTokens and Secrets are the id_tokens (own or default:'s) and
	// secrets keywords.
	IDTokens []IDToken `json:"id_tokens,omitempty"`
	Secrets  []Secret  `json:"secrets,omitempty"`

	// Isolation is the isolation level the job asks for: the stronger of
	// the isolation keyword (the job's or default:'s) and the
	// BERTH_ISOLATION variable the job sees. Empty when it asks for none
	// (it runs at none, or at its project's minimum).
	Isolation executor.Isolation `json:"isolation,omitempty"`

	// NodeIndex and NodeTotal are CI_NODE_INDEX and CI_NODE_TOTAL of a
	// parallel or matrix job (1-based); zero otherwise.
	NodeIndex int `json:"node_index,omitempty"`
	NodeTotal int `json:"node_total,omitempty"`
	// Matrix holds the matrix variables of this instance (also in
	// Variables).
	Matrix []Variable `json:"matrix,omitempty"`

	Rules RulesOutcome `json:"rules"`
}

// RulesOutcome records how rules decided a job.
type RulesOutcome struct {
	Defined bool `json:"defined"` // the job has rules
	// Matched is the 0-based index of the rule that matched, -1 when none
	// did (or there are no rules).
	Matched int `json:"matched"`
	Pos     Pos `json:"pos,omitempty"` // position of the matched rule
	// Filter is what only/except did to a job without rules: "" (it has
	// neither), "only/except let it in", "only did not match", "except
	// matched".
	Filter string `json:"filter,omitempty"`
}

// String describes the outcome for people.
func (r RulesOutcome) String() string {
	switch {
	case !r.Defined && r.Filter != "":
		return r.Filter
	case !r.Defined:
		return "no rules"
	case r.Matched < 0:
		return "no rule matched"
	default:
		return "rule " + itoa(r.Matched+1) + " matched"
	}
}

// Variable is a YAML variable.
type Variable struct {
	Key         string   `json:"key"`
	Value       string   `json:"value"`
	Raw         bool     `json:"raw,omitempty"` // expand: false
	Description string   `json:"description,omitempty"`
	Options     []string `json:"options,omitempty"`
	Pos         Pos      `json:"pos"`
}

// Need is one entry of needs.
// CrossNeed is a need on a job outside the pipeline: Pipeline (an id or a
// variable such as $PARENT_PIPELINE_ID: a pipeline of the same
// parent-child hierarchy) or Project (its latest successful Job on Ref).
// Values are as written; the coordinator expands them.
type CrossNeed struct {
	Pipeline  string `json:"pipeline,omitempty"`
	Project   string `json:"project,omitempty"`
	Ref       string `json:"ref,omitempty"`
	Job       string `json:"job"`
	Artifacts bool   `json:"artifacts"`
	Pos       Pos    `json:"pos"`
}

type Need struct {
	Job       string `json:"job"`
	Artifacts bool   `json:"artifacts"`
	Optional  bool   `json:"optional,omitempty"`
	Pos       Pos    `json:"pos"`
}

// Image is an image or a service.
type Image struct {
	Name       string     `json:"name"`
	Alias      string     `json:"alias,omitempty"`
	Entrypoint []string   `json:"entrypoint,omitempty"`
	Command    []string   `json:"command,omitempty"`
	Variables  []Variable `json:"variables,omitempty"`
	PullPolicy []string   `json:"pull_policy,omitempty"`
	// Docker holds docker:platform and docker:user.
	DockerPlatform string `json:"docker_platform,omitempty"`
	DockerUser     string `json:"docker_user,omitempty"`
	KubernetesUser string `json:"kubernetes_user,omitempty"`
}

// Artifacts is the artifacts keyword.
type Artifacts struct {
	Name      string   `json:"name,omitempty"`
	Paths     []string `json:"paths,omitempty"`
	Exclude   []string `json:"exclude,omitempty"`
	Untracked bool     `json:"untracked,omitempty"`
	When      When     `json:"when"` // on_success, on_failure or always
	ExpireIn  string   `json:"expire_in,omitempty"`
	ExposeAs  string   `json:"expose_as,omitempty"`
	Public    *bool    `json:"public,omitempty"`
	Access    string   `json:"access,omitempty"`
	Reports   []Report `json:"reports,omitempty"`
}

// Report is one artifacts:reports entry.
type Report struct {
	Type           string   `json:"type"` // junit, dotenv, coverage_report, ...
	Paths          []string `json:"paths"`
	CoverageFormat string   `json:"coverage_format,omitempty"` // coverage_report only
}

// Cache is one cache entry.
type Cache struct {
	// Key is the cache key: the key keyword, the computed key:files or
	// key:files_commits key, or "default". Empty only when KeyFiles is set
	// and Env.CacheKey is nil.
	Key      string   `json:"key"`
	KeyFiles []string `json:"key_files,omitempty"`
	// KeyByCommits: KeyFiles came from key:files_commits.
	KeyByCommits bool     `json:"key_by_commits,omitempty"`
	KeyPrefix    string   `json:"key_prefix,omitempty"`
	Paths        []string `json:"paths,omitempty"`
	Untracked    bool     `json:"untracked,omitempty"`
	Policy       string   `json:"policy"` // pull-push, pull or push
	When         When     `json:"when"`
	FallbackKeys []string `json:"fallback_keys,omitempty"`
	Unprotect    bool     `json:"unprotect,omitempty"`
}

// Retry is the retry keyword.
type Retry struct {
	Max       int      `json:"max"`
	When      []string `json:"when,omitempty"` // failure reasons; empty means always
	ExitCodes []int    `json:"exit_codes,omitempty"`
}

// Environment is the environment keyword, recorded for the coordinator.
type Environment struct {
	Name           string `json:"name"`
	URL            string `json:"url,omitempty"`
	OnStop         string `json:"on_stop,omitempty"`
	Action         string `json:"action,omitempty"` // start (default), prepare, stop, verify, access
	AutoStopIn     string `json:"auto_stop_in,omitempty"`
	DeploymentTier string `json:"deployment_tier,omitempty"`
	KubernetesNS   string `json:"kubernetes_namespace,omitempty"`
}

// jobJSON carries durations as seconds in JSON.
type jobJSON struct {
	*jobAlias
	TimeoutSeconds int64 `json:"timeout_seconds,omitempty"`
	StartInSeconds int64 `json:"start_in_seconds,omitempty"`
}

type jobAlias Job

// MarshalJSON writes the job with timeout and start_in in seconds.
func (j *Job) MarshalJSON() ([]byte, error) {
	return json.Marshal(jobJSON{jobAlias: (*jobAlias)(j), TimeoutSeconds: int64(j.Timeout / time.Second), StartInSeconds: int64(j.StartIn / time.Second)})
}

// UnmarshalJSON reads what MarshalJSON writes, so a coordinator can store
// compiled jobs as JSON.
func (j *Job) UnmarshalJSON(b []byte) error {
	v := jobJSON{jobAlias: (*jobAlias)(j)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	j.Timeout = time.Duration(v.TimeoutSeconds) * time.Second
	j.StartIn = time.Duration(v.StartInSeconds) * time.Second
	return nil
}
