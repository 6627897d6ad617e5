// Package restapi holds the wire types of the coordinator's REST API: the
// GitLab-shaped project, pipeline, job, runner, variable, release,
// environment, deployment and Pages bodies (the fields Berth has), and
// Berth's own. The server side is coordinator/resthttp; Go clients
// (coordinator/client, berth's CLI) decode the same types.
package restapi

import (
	"encoding/json"
	"time"

	"github.com/berthci/berth/runnerapi"
)

// ProjectJSON is a project as GitLab's projects API shows it.
type ProjectJSON struct {
	ID                int64   `json:"id"`
	Name              string  `json:"name"`
	Path              string  `json:"path"`
	PathWithNamespace string  `json:"path_with_namespace"`
	NameWithNamespace string  `json:"name_with_namespace"`
	Description       string  `json:"description"`
	DefaultBranch     string  `json:"default_branch"`
	Visibility        string  `json:"visibility"`
	HTTPURLToRepo     string  `json:"http_url_to_repo"`
	WebURL            string  `json:"web_url"`
	CreatedAt         *string `json:"created_at"`
	// MinIsolation is Berth's: the weakest isolation level the project's
	// jobs run at (none when unset); docs/isolation.md.
	MinIsolation string `json:"min_isolation"`

	Namespace struct {
		Name     string `json:"name"`
		Path     string `json:"path"`
		FullPath string `json:"full_path"`
		Kind     string `json:"kind"`
	} `json:"namespace"`
}

// CreateProjectRequest is the body of POST /projects. path may be a full
// path ("group/demo"); namespace_path is prepended when given.
type CreateProjectRequest struct {
	Name          string `json:"name"`
	Path          string `json:"path"`
	NamespacePath string `json:"namespace_path,omitempty"`
	Description   string `json:"description,omitempty"`
	DefaultBranch string `json:"default_branch,omitempty"`
	Visibility    string `json:"visibility,omitempty"`
	// MinIsolation is Berth's: the project's minimum isolation level.
	MinIsolation string `json:"min_isolation,omitempty"`
}

// UpdateProjectRequest is the body of PUT /projects/:id: fields left out
// are not changed.
type UpdateProjectRequest struct {
	Name         *string `json:"name,omitempty"`
	Description  *string `json:"description,omitempty"`
	Visibility   *string `json:"visibility,omitempty"`
	MinIsolation *string `json:"min_isolation,omitempty"`
}

// PipelineJSON is a pipeline as GitLab's pipelines API shows it.
type PipelineJSON struct {
	ID             int64    `json:"id"`
	IID            int64    `json:"iid"`
	ProjectID      int64    `json:"project_id"`
	Sha            string   `json:"sha"`
	BeforeSha      string   `json:"before_sha"`
	Ref            string   `json:"ref"`
	Tag            bool     `json:"tag"`
	Status         string   `json:"status"`
	Source         string   `json:"source"`
	YAMLErrors     *string  `json:"yaml_errors"`
	CreatedAt      *string  `json:"created_at"`
	UpdatedAt      *string  `json:"updated_at"`
	StartedAt      *string  `json:"started_at"`
	FinishedAt     *string  `json:"finished_at"`
	Duration       *float64 `json:"duration"`
	QueuedDuration *float64 `json:"queued_duration"`
	WebURL         string   `json:"web_url"`
	// UpstreamPipelineID and SourceJobID are Berth's: the pipeline and
	// trigger job that created a downstream pipeline (GitLab shows the
	// link from the other side, in a bridge's downstream_pipeline).
	UpstreamPipelineID int64 `json:"upstream_pipeline_id,omitempty"`
	SourceJobID        int64 `json:"source_job_id,omitempty"`
}

// CreatePipelineRequest is the body of POST /projects/:id/pipeline (ref
// may also be a query parameter).
type CreatePipelineRequest struct {
	Ref       string             `json:"ref"`
	Variables []PipelineVariable `json:"variables,omitempty"`
	// Inputs are pipeline inputs for a spec:inputs header of
	// .gitlab-ci.yml: JSON strings, numbers, booleans and arrays.
	Inputs map[string]any `json:"inputs,omitempty"`
}

// VariableJSON is a project variable as GitLab's API shows and takes it.
type VariableJSON struct {
	Key              string `json:"key"`
	Value            string `json:"value"`
	VariableType     string `json:"variable_type"`
	Protected        bool   `json:"protected"`
	Masked           bool   `json:"masked"`
	Raw              bool   `json:"raw"`
	EnvironmentScope string `json:"environment_scope"`
	Description      string `json:"description"`
}

// ReleaseJSON is a release as GitLab's releases API shows it (the fields
// Berth has; it serves no source archives, so assets:sources is empty).
type ReleaseJSON struct {
	TagName         string  `json:"tag_name"`
	Name            string  `json:"name"`
	Description     string  `json:"description"`
	CreatedAt       *string `json:"created_at"`
	ReleasedAt      *string `json:"released_at"`
	UpcomingRelease bool    `json:"upcoming_release"`
	Milestones      []struct {
		Title string `json:"title"`
	} `json:"milestones"`
	Commit struct {
		ID      string `json:"id"`
		ShortID string `json:"short_id"`
	} `json:"commit"`
	TagPath string `json:"tag_path"`
	Assets  struct {
		Count   int               `json:"count"`
		Sources []map[string]any  `json:"sources"`
		Links   []ReleaseLinkJSON `json:"links"`
	} `json:"assets"`
	Links struct {
		Self string `json:"self"`
	} `json:"_links"`
}

// ReleaseLinkJSON is one asset link of a release.
type ReleaseLinkJSON struct {
	ID              int64  `json:"id"`
	Name            string `json:"name"`
	URL             string `json:"url"`
	DirectAssetURL  string `json:"direct_asset_url"`
	DirectAssetPath string `json:"direct_asset_path,omitempty"`
	LinkType        string `json:"link_type"`
}

// EnvironmentJSON is an environment as GitLab's environments API shows
// it; LastDeployment only in the single-environment answer.
type EnvironmentJSON struct {
	ID             int64           `json:"id"`
	Name           string          `json:"name"`
	Slug           string          `json:"slug"`
	ExternalURL    *string         `json:"external_url"`
	State          string          `json:"state"`
	Tier           string          `json:"tier"`
	CreatedAt      *string         `json:"created_at"`
	UpdatedAt      *string         `json:"updated_at"`
	AutoStopAt     *string         `json:"auto_stop_at"`
	LastDeployment *DeploymentJSON `json:"last_deployment,omitempty"`
}

// DeploymentJSON is a deployment as GitLab's deployments API shows it.
type DeploymentJSON struct {
	ID          int64            `json:"id"`
	IID         int64            `json:"iid"`
	Ref         string           `json:"ref"`
	Sha         string           `json:"sha"`
	Status      string           `json:"status"`
	CreatedAt   *string          `json:"created_at"`
	UpdatedAt   *string          `json:"updated_at"`
	FinishedAt  *string          `json:"finished_at"`
	User        *struct{}        `json:"user"`
	Environment *EnvironmentJSON `json:"environment,omitempty"`
	Deployable  *JobJSON         `json:"deployable"`
}

// PagesJSON is GitLab's GET /projects/:id/pages (Berth has no custom
// domains and serves sites below its own URL).
type PagesJSON struct {
	URL                   string                `json:"url"`
	IsUniqueDomainEnabled bool                  `json:"is_unique_domain_enabled"`
	ForceHTTPS            bool                  `json:"force_https"`
	Deployments           []PagesDeploymentJSON `json:"deployments"`
	PrimaryDomain         *string               `json:"primary_domain"`
}

// PagesDeploymentJSON is one deployment of a Pages site. ExpiresAt and
// JobID are Berth's.
type PagesDeploymentJSON struct {
	CreatedAt     *string `json:"created_at"`
	URL           string  `json:"url"`
	PathPrefix    string  `json:"path_prefix"`
	RootDirectory string  `json:"root_directory"`
	ExpiresAt     *string `json:"expires_at"`
	JobID         int64   `json:"job_id"`
	FileCount     int     `json:"file_count"`
	Size          int64   `json:"size"`
}

// PipelineBasicJSON is a pipeline as GitLab's PipelineBasic entity shows
// it: a bridge's pipeline and downstream_pipeline, a schedule's
// last_pipeline and pipelines.
type PipelineBasicJSON struct {
	ID        int64   `json:"id"`
	IID       int64   `json:"iid"`
	ProjectID int64   `json:"project_id"`
	Sha       string  `json:"sha"`
	Ref       string  `json:"ref"`
	Status    string  `json:"status"`
	Source    string  `json:"source"`
	CreatedAt *string `json:"created_at"`
	UpdatedAt *string `json:"updated_at"`
	WebURL    string  `json:"web_url"`
}

// BridgeJSON is a trigger job as GitLab's GET
// /projects/:id/pipelines/:pipeline_id/bridges shows it.
type BridgeJSON struct {
	ID             int64    `json:"id"`
	Name           string   `json:"name"`
	Stage          string   `json:"stage"`
	Status         string   `json:"status"`
	Ref            string   `json:"ref"`
	Tag            bool     `json:"tag"`
	Coverage       *float64 `json:"coverage"`
	AllowFailure   bool     `json:"allow_failure"`
	CreatedAt      *string  `json:"created_at"`
	StartedAt      *string  `json:"started_at"`
	FinishedAt     *string  `json:"finished_at"`
	ErasedAt       *string  `json:"erased_at"`
	Duration       *float64 `json:"duration"`
	QueuedDuration *float64 `json:"queued_duration"`
	FailureReason  string   `json:"failure_reason,omitempty"`
	WebURL         string   `json:"web_url"`
	// Retried is Berth's, as on jobs (include_retried=true lists them).
	Retried            bool               `json:"retried,omitempty"`
	Pipeline           PipelineBasicJSON  `json:"pipeline"`
	DownstreamPipeline *PipelineBasicJSON `json:"downstream_pipeline"`
}

// JobJSON is a job as GitLab's jobs API shows it (the fields Berth has).
type JobJSON struct {
	ID             int64    `json:"id"`
	Name           string   `json:"name"`
	Stage          string   `json:"stage"`
	Status         string   `json:"status"`
	Ref            string   `json:"ref"`
	Tag            bool     `json:"tag"`
	TagList        []string `json:"tag_list"`
	Priority       int      `json:"priority"`
	CreatedAt      *string  `json:"created_at"`
	StartedAt      *string  `json:"started_at"`
	FinishedAt     *string  `json:"finished_at"`
	ErasedAt       *string  `json:"erased_at"`
	Duration       *float64 `json:"duration"`
	QueuedDuration *float64 `json:"queued_duration"`
	FailureReason  string   `json:"failure_reason,omitempty"`
	ExitCode       *int     `json:"exit_code,omitempty"`
	Timeout        int      `json:"timeout"`
	AllowFailure   bool     `json:"allow_failure"`
	ScheduledAt    *string  `json:"scheduled_at,omitempty"`
	// ArtifactsExpireAt is when the job's artifacts archive expires
	// (null: it does not, or there is none).
	ArtifactsExpireAt *string `json:"artifacts_expire_at"`
	// Retried is Berth's: GitLab's job lists leave retried jobs out
	// unless include_retried=true, and then this tells them apart.
	Retried bool `json:"retried,omitempty"`
	// PendingReason is Berth's: why a pending job is not handed out, when
	// the coordinator knows (today: no online runner offers the isolation
	// level it needs; docs/isolation.md).
	PendingReason string `json:"pending_reason,omitempty"`

	Pipeline struct {
		ID        int64  `json:"id"`
		ProjectID int64  `json:"project_id"`
		Ref       string `json:"ref"`
	} `json:"pipeline"`
	Project struct {
		ID int64 `json:"id"`
	} `json:"project"`
	Runner *struct {
		ID int64 `json:"id"`
	} `json:"runner"`
	RunnerManager *struct {
		ID int64 `json:"id"`
	} `json:"runner_manager"`
	Artifacts []ArtifactJSON `json:"artifacts"`
}

// ArtifactJSON is one artifact file of a job.
type ArtifactJSON struct {
	FileType   string  `json:"file_type"`
	Size       int64   `json:"size"`
	Filename   string  `json:"filename"`
	FileFormat string  `json:"file_format"`
	ExpireAt   *string `json:"expire_at"`
}

// SnapshotJSON is a failed job's VM snapshot as GET /api/v4/snapshots
// lists it (Berth-only, admins; docs/coordinator.md). Size is the
// bundle's, as GET /api/v4/jobs/:id/snapshot sends it; ExpireAt is left
// out (zero) when the snapshot never expires.
type SnapshotJSON struct {
	JobID       int64     `json:"job_id"`
	JobName     string    `json:"job_name"`
	ProjectID   int64     `json:"project_id"`
	ProjectPath string    `json:"project_path"`
	PipelineID  int64     `json:"pipeline_id"`
	Size        int64     `json:"size"`
	CreatedAt   time.Time `json:"created_at"`
	ExpireAt    time.Time `json:"expire_at,omitzero"`
}

// QueueStats is the body of GET /api/v4/berth/queue.
type QueueStats struct {
	Queued  int           `json:"queued"`
	Waiting int           `json:"waiting_requests"`
	TagSets []TagSetStats `json:"tag_sets"`
}

// TagSetStats is the backlog of one set of tags.
type TagSetStats struct {
	Tags              []string `json:"tags"`
	Queued            int      `json:"queued"`
	OldestWaitSeconds float64  `json:"oldest_wait_seconds"`
}

// CreateRunnerRequest is the body of POST /api/v4/user/runners.
type CreateRunnerRequest struct {
	RunnerType      string            `json:"runner_type"`
	GroupID         int64             `json:"group_id,omitempty"`
	ProjectID       int64             `json:"project_id,omitempty"`
	Description     string            `json:"description,omitempty"`
	MaintenanceNote string            `json:"maintenance_note,omitempty"`
	Paused          bool              `json:"paused,omitempty"`
	Locked          bool              `json:"locked,omitempty"`
	RunUntagged     *bool             `json:"run_untagged,omitempty"`
	TagList         runnerapi.TagList `json:"tag_list,omitempty"`
	AccessLevel     string            `json:"access_level,omitempty"`
	MaximumTimeout  int               `json:"maximum_timeout,omitempty"`
}

// RunnerJSON is a runner as GET /runners/all lists it.
type RunnerJSON struct {
	ID             int64    `json:"id"`
	Description    string   `json:"description"`
	RunnerType     string   `json:"runner_type"`
	IsShared       bool     `json:"is_shared"`
	Paused         bool     `json:"paused"`
	Active         bool     `json:"active"`
	Locked         bool     `json:"locked"`
	RunUntagged    bool     `json:"run_untagged"`
	TagList        []string `json:"tag_list"`
	AccessLevel    string   `json:"access_level"`
	MaximumTimeout *int     `json:"maximum_timeout"`
	Online         bool     `json:"online"`
	Status         string   `json:"status"`
	ContactedAt    *string  `json:"contacted_at"`
	GroupID        int64    `json:"group_id,omitempty"`
	ProjectIDs     []int64  `json:"project_ids,omitempty"`
}

// UpdateRunnerRequest is PUT /runners/:id, GitLab's "update a runner's
// details"; absent fields are left as they are. (GitLab's deprecated
// active is paused's opposite.)
type UpdateRunnerRequest struct {
	Description     *string   `json:"description,omitempty"`
	MaintenanceNote *string   `json:"maintenance_note,omitempty"`
	Paused          *bool     `json:"paused,omitempty"`
	Active          *bool     `json:"active,omitempty"`
	TagList         *[]string `json:"tag_list,omitempty"`
	RunUntagged     *bool     `json:"run_untagged,omitempty"`
	Locked          *bool     `json:"locked,omitempty"`
	AccessLevel     *string   `json:"access_level,omitempty"`
	MaximumTimeout  *int      `json:"maximum_timeout,omitempty"`
}

// PipelineVariable is a variable given when creating a pipeline.
type PipelineVariable struct {
	Key   string `json:"key"`
	Value string `json:"value"`
	// VariableType is env_var (default) or file.
	VariableType string `json:"variable_type,omitempty"`
}

// UserJSON is a web UI user (Berth-only: /api/v4/berth/users). Token is
// set only in the answer to its creation, the one time it is shown.
type UserJSON struct {
	ID        int64   `json:"id"`
	Name      string  `json:"name"`
	Role      string  `json:"role"`
	CreatedAt *string `json:"created_at"`
	Token     string  `json:"token,omitempty"`
}

// MemberJSON is a project member, as GitLab's members API answers it
// (username and name are both the Berth user's name).
type MemberJSON struct {
	ID          int64   `json:"id"`
	Username    string  `json:"username"`
	Name        string  `json:"name"`
	State       string  `json:"state"`
	AccessLevel int     `json:"access_level"`
	CreatedAt   *string `json:"created_at"`
	ExpiresAt   *string `json:"expires_at"`
}

// CurrentUserJSON is GET /user: whom a token belongs to (id 0 and
// username "admin" for the admin token).
type CurrentUserJSON struct {
	ID        int64   `json:"id"`
	Username  string  `json:"username"`
	Name      string  `json:"name"`
	State     string  `json:"state"`
	IsAdmin   bool    `json:"is_admin"`
	CreatedAt *string `json:"created_at"`
}

// MemberRequest is the body of POST /projects/:id/members (user_id or
// username, and access_level) and of PUT /projects/:id/members/:user_id
// (access_level). user_id may be a number or a string of one, as GitLab
// takes it.
type MemberRequest struct {
	UserID      json.Number `json:"user_id,omitempty"`
	Username    string      `json:"username,omitempty"`
	AccessLevel int         `json:"access_level"`
}

// CreateUserRequest is the body of POST /api/v4/berth/users.
type CreateUserRequest struct {
	Name string `json:"name"`
	// Role is admin or read-only (default read-only).
	Role string `json:"role"`
}

// PipelineScheduleJSON is a pipeline schedule as GitLab's pipeline
// schedules API shows it; LastPipeline and Variables only for one
// schedule (GitLab's PipelineScheduleDetails), Variables only to those
// who may read them (maintainers and the schedule's owner).
type PipelineScheduleJSON struct {
	ID           int64                   `json:"id"`
	Description  string                  `json:"description"`
	Ref          string                  `json:"ref"`
	Cron         string                  `json:"cron"`
	CronTimezone string                  `json:"cron_timezone"`
	NextRunAt    *string                 `json:"next_run_at"`
	Active       bool                    `json:"active"`
	CreatedAt    *string                 `json:"created_at"`
	UpdatedAt    *string                 `json:"updated_at"`
	Owner        UserBasicJSON           `json:"owner"`
	Inputs       []ScheduleInputJSON     `json:"inputs,omitempty"`
	LastPipeline *PipelineBasicJSON      `json:"last_pipeline,omitempty"`
	Variables    *[]ScheduleVariableJSON `json:"variables,omitempty"`
}

// UserBasicJSON is a user as GitLab's UserBasic entity shows one (id 0
// and username "admin" for Berth's admin token).
type UserBasicJSON struct {
	ID       int64  `json:"id"`
	Username string `json:"username"`
	Name     string `json:"name"`
	State    string `json:"state"`
}

// ScheduleVariableJSON is a pipeline schedule's variable, shown and taken
// (POST and PUT …/pipeline_schedules/:id/variables).
type ScheduleVariableJSON struct {
	Key          string `json:"key"`
	Value        string `json:"value"`
	VariableType string `json:"variable_type"`
}

// PipelineVariableJSON is a pipeline's variable as
// GET /projects/:id/pipelines/:pipeline_id/variables shows it.
type PipelineVariableJSON struct {
	VariableType string `json:"variable_type"`
	Key          string `json:"key"`
	Value        string `json:"value"`
	Raw          bool   `json:"raw"`
}

// ScheduleInputJSON is a value for one of the pipeline's spec:inputs.
type ScheduleInputJSON struct {
	Name  string `json:"name"`
	Value any    `json:"value"`
}

// PipelineTriggerJSON is a pipeline trigger token as GitLab's triggers API
// shows it. Token is the whole token only in the answer that created it:
// Berth keeps its digest, so later answers show its first characters.
type PipelineTriggerJSON struct {
	ID          int64         `json:"id"`
	Token       string        `json:"token"`
	Description string        `json:"description"`
	CreatedAt   *string       `json:"created_at"`
	UpdatedAt   *string       `json:"updated_at"`
	LastUsed    *string       `json:"last_used"`
	ExpiresAt   *string       `json:"expires_at"`
	Owner       UserBasicJSON `json:"owner"`
}

// TestCountsJSON is the time and the cases by status of a test report
// or of one of its suites.
type TestCountsJSON struct {
	TotalTime    float64 `json:"total_time"`
	TotalCount   int     `json:"total_count"`
	SuccessCount int     `json:"success_count"`
	FailedCount  int     `json:"failed_count"`
	SkippedCount int     `json:"skipped_count"`
	ErrorCount   int     `json:"error_count"`
}

// TestReportJSON is GET /projects/:id/pipelines/:pipeline_id/test_report:
// the pipeline's JUnit reports, a suite per job (GitLab's TestReportEntity).
type TestReportJSON struct {
	TestCountsJSON
	TestSuites []TestSuiteJSON `json:"test_suites"`
}

// TestSuiteJSON is one suite of a test report.
type TestSuiteJSON struct {
	Name string `json:"name"`
	TestCountsJSON
	SuiteError *string        `json:"suite_error"`
	TestCases  []TestCaseJSON `json:"test_cases"`
}

// TestCaseJSON is one test case; AttachmentURL is set for a case whose
// output names an attachment (a screenshot in the job's artifacts).
type TestCaseJSON struct {
	Status         string  `json:"status"`
	Name           string  `json:"name"`
	Classname      string  `json:"classname"`
	File           *string `json:"file"`
	ExecutionTime  float64 `json:"execution_time"`
	SystemOutput   *string `json:"system_output"`
	StackTrace     *string `json:"stack_trace"` // null: JUnit has none (nor has GitLab's parser)
	RecentFailures any     `json:"recent_failures"`
	AttachmentURL  string  `json:"attachment_url,omitempty"`
}

// TestReportSummaryJSON is GET …/pipelines/:pipeline_id/test_report_summary.
type TestReportSummaryJSON struct {
	Total      TestTotalJSON          `json:"total"`
	TestSuites []TestSuiteSummaryJSON `json:"test_suites"`
}

// TestTotalJSON is a summary's totals.
type TestTotalJSON struct {
	Time       float64 `json:"time"`
	Count      int     `json:"count"`
	Success    int     `json:"success"`
	Failed     int     `json:"failed"`
	Skipped    int     `json:"skipped"`
	Error      int     `json:"error"`
	SuiteError *string `json:"suite_error"`
}

// TestSuiteSummaryJSON is one suite of a summary, with the jobs it comes
// from.
type TestSuiteSummaryJSON struct {
	Name string `json:"name"`
	TestCountsJSON
	BuildIDs   []int64 `json:"build_ids"`
	SuiteError *string `json:"suite_error"`
}
