// Package runnerapi holds the wire types of GitLab's Runner API v4 as the
// real gitlab-runner and GitLab exchange them: request and response bodies
// of /api/v4/runners*, /api/v4/jobs/request, PUT /api/v4/jobs/:id and the
// job payload. Both Berth's coordinator and its runner use these types, so
// field names are written once.
//
// Unknown JSON fields are ignored when decoding, as the runner does.
package runnerapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Header names of the protocol.
const (
	HeaderLastUpdate          = "X-GitLab-Last-Update"
	HeaderJobStatus           = "Job-Status"
	HeaderTraceUpdateInterval = "X-GitLab-Trace-Update-Interval"
	HeaderJobToken            = "JOB-TOKEN"
	HeaderRunnerToken         = "RUNNER-TOKEN"
	HeaderPrivateToken        = "PRIVATE-TOKEN"
	HeaderContentRange        = "Content-Range"
	HeaderRange               = "Range"
	HeaderRequestID           = "X-Request-Id"
)

// TagList decodes GitLab's tag_list, which clients send either as a
// comma-separated string or as an array of strings.
type TagList []string

// UnmarshalJSON accepts "a,b" and ["a","b"].
func (t *TagList) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*t = nil
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*t = SplitTags(s)
		return nil
	}
	var list []string
	if err := json.Unmarshal(b, &list); err != nil {
		return fmt.Errorf("tag_list: want a string or an array of strings")
	}
	*t = list
	return nil
}

// SplitTags splits a comma-separated tag string, trimming blanks.
func SplitTags(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// FlexString decodes a JSON string or number as a string (image "user"
// may be either).
type FlexString string

// UnmarshalJSON accepts a string or a number.
func (f *FlexString) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*f = ""
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*f = FlexString(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("want a string or a number")
	}
	*f = FlexString(n.String())
	return nil
}

// MarshalJSON writes a number when the value is an integer, else a string.
func (f FlexString) MarshalJSON() ([]byte, error) {
	if n, err := strconv.ParseInt(string(f), 10, 64); err == nil && strconv.FormatInt(n, 10) == string(f) {
		return []byte(f), nil
	}
	return json.Marshal(string(f))
}

// Features are the booleans a runner advertises in info.features.
type Features struct {
	Variables               bool `json:"variables"`
	Image                   bool `json:"image"`
	Services                bool `json:"services"`
	Artifacts               bool `json:"artifacts"`
	Cache                   bool `json:"cache"`
	FallbackCacheKeys       bool `json:"fallback_cache_keys"`
	Shared                  bool `json:"shared"`
	UploadMultipleArtifacts bool `json:"upload_multiple_artifacts"`
	UploadRawArtifacts      bool `json:"upload_raw_artifacts"`
	Session                 bool `json:"session"`
	Terminal                bool `json:"terminal"`
	Refspecs                bool `json:"refspecs"`
	Masking                 bool `json:"masking"`
	Proxy                   bool `json:"proxy"`
	RawVariables            bool `json:"raw_variables"`
	ArtifactsExclude        bool `json:"artifacts_exclude"`
	MultiBuildSteps         bool `json:"multi_build_steps"`
	TraceReset              bool `json:"trace_reset"`
	TraceChecksum           bool `json:"trace_checksum"`
	TraceSize               bool `json:"trace_size"`
	VaultSecrets            bool `json:"vault_secrets"`
	Cancelable              bool `json:"cancelable"`
	ReturnExitCode          bool `json:"return_exit_code"`
	ServiceVariables        bool `json:"service_variables"`
	ServiceMultipleAliases  bool `json:"service_multiple_aliases"`
	ImageExecutorOpts       bool `json:"image_executor_opts"`
	ServiceExecutorOpts     bool `json:"service_executor_opts"`
	CancelGracefully        bool `json:"cancel_gracefully"`
	NativeStepsIntegration  bool `json:"native_steps_integration"`
	TwoPhaseJobCommit       bool `json:"two_phase_job_commit"`
	JobInputs               bool `json:"job_inputs"`
}

// Info describes the runner (sent with register, verify, jobs/request and
// job updates).
type Info struct {
	Name         string            `json:"name,omitempty"`
	Version      string            `json:"version,omitempty"`
	Revision     string            `json:"revision,omitempty"`
	Platform     string            `json:"platform,omitempty"`
	Architecture string            `json:"architecture,omitempty"`
	Executor     string            `json:"executor,omitempty"`
	Shell        string            `json:"shell,omitempty"`
	Features     Features          `json:"features"`
	Config       *InfoConfig       `json:"config,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	// IsolationLevels are the isolation levels the runner's jobs run at
	// (none, cgroups, container, microvm, vm, instance). A Berth
	// extension: GitLab ignores it; Berth's coordinator hands a job that
	// asks for a level only to a runner offering it or a stronger one.
	IsolationLevels []string `json:"isolation_levels,omitempty"`
}

// IsolationVariable is the job variable by which a job asks for an
// isolation level (the Berth keyword isolation: sets it too).
const IsolationVariable = "BERTH_ISOLATION"

// Branching a parallel:matrix (docs/snapshots.md). A job asks with
// MatrixBranchVariable ("true"); Berth's coordinator gives every matrix
// job the other three: its job's name before expansion, the names of its
// matrix variables (comma-separated) and how many of the script step's
// first lines are before_script.
const (
	MatrixBranchVariable      = "BERTH_MATRIX_BRANCH"
	MatrixGroupVariable       = "BERTH_MATRIX_GROUP"
	MatrixVariablesVariable   = "BERTH_MATRIX_VARIABLES"
	BeforeScriptLinesVariable = "BERTH_BEFORE_SCRIPT_LINES"
)

// InfoConfig is info.config.
type InfoConfig struct {
	GPUs string `json:"gpus,omitempty"`
}

// RegisterRequest is the body of POST /runners.
type RegisterRequest struct {
	Token           string  `json:"token"`
	Description     string  `json:"description,omitempty"`
	MaintenanceNote string  `json:"maintenance_note,omitempty"`
	TagList         TagList `json:"tag_list,omitempty"`
	RunUntagged     *bool   `json:"run_untagged,omitempty"`
	Locked          *bool   `json:"locked,omitempty"`
	Paused          *bool   `json:"paused,omitempty"`
	AccessLevel     string  `json:"access_level,omitempty"`
	MaximumTimeout  int     `json:"maximum_timeout,omitempty"`
	Info            *Info   `json:"info,omitempty"`
}

// RunnerTokenResponse is the 201/200 body of register, verify and
// reset_authentication_token.
type RunnerTokenResponse struct {
	ID             int64   `json:"id,omitempty"`
	Token          string  `json:"token"`
	TokenExpiresAt *string `json:"token_expires_at"`
}

// VerifyRequest is the body of POST /runners/verify.
type VerifyRequest struct {
	Token    string `json:"token"`
	SystemID string `json:"system_id,omitempty"`
	Info     *Info  `json:"info,omitempty"`
}

// TokenRequest is the body of DELETE /runners and POST
// /runners/reset_authentication_token.
type TokenRequest struct {
	Token string `json:"token"`
}

// ManagerRequest is the body of DELETE /runners/managers.
type ManagerRequest struct {
	Token    string `json:"token"`
	SystemID string `json:"system_id"`
}

// JobRequest is the body of POST /jobs/request.
type JobRequest struct {
	Token      string   `json:"token"`
	SystemID   string   `json:"system_id,omitempty"`
	LastUpdate string   `json:"last_update,omitempty"`
	Info       *Info    `json:"info,omitempty"`
	Session    *Session `json:"session,omitempty"`
}

// Session is the interactive web terminal endpoint a runner offers.
type Session struct {
	URL           string `json:"url,omitempty"`
	Certificate   string `json:"certificate,omitempty"`
	Authorization string `json:"authorization,omitempty"`
}

// Job states a runner reports.
const (
	StatePending = "pending"
	StateRunning = "running"
	StateSuccess = "success"
	StateFailed  = "failed"
)

// Failure reasons a runner reports.
const (
	ScriptFailure                   = "script_failure"
	RunnerSystemFailure             = "runner_system_failure"
	JobExecutionTimeout             = "job_execution_timeout"
	ImagePullFailure                = "image_pull_failure"
	UnknownFailure                  = "unknown_failure"
	RunnerConfigurationError        = "runner_configuration_error"
	RunnerExternalDependencyFailure = "runner_external_dependency_failure"
	RunnerInterrupted               = "runner_interrupted"
	JobCanceled                     = "job_canceled"
)

// Failure reasons the server sets itself.
const (
	StuckOrTimeoutFailure = "stuck_or_timeout_failure"
	NoUpdatesRunning      = "no_updates_running"
	NoUpdatesCanceling    = "no_updates_canceling"
	DataIntegrityFailure  = "data_integrity_failure"
	TraceSizeExceeded     = "trace_size_exceeded"
	// SecretsProviderNotFound: the job has secrets whose provider its
	// variables do not configure (GitLab's pre-assign check).
	SecretsProviderNotFound = "secrets_provider_not_found"
	// UnmetPrerequisites: what the job needs before it can run is missing
	// (for Berth: an ID token to log in to a secrets provider with).
	UnmetPrerequisites = "unmet_prerequisites"
)

// RunnerFailureReasons is the list a coordinator offers in
// features.failure_reasons. It includes job_canceled so that a runner
// reports a graceful cancel as such instead of unknown_failure.
var RunnerFailureReasons = []string{
	ScriptFailure, RunnerSystemFailure, JobExecutionTimeout, ImagePullFailure, UnknownFailure,
	RunnerConfigurationError, RunnerExternalDependencyFailure, RunnerInterrupted, JobCanceled,
}

// Output is the trace summary sent with a job update.
type Output struct {
	Checksum string `json:"checksum,omitempty"`
	Bytesize int64  `json:"bytesize"`
}

// UpdateJobRequest is the body of PUT /jobs/:id.
type UpdateJobRequest struct {
	Token                 string  `json:"token,omitempty"`
	State                 string  `json:"state"`
	FailureReason         string  `json:"failure_reason,omitempty"`
	ExitCode              int     `json:"exit_code,omitempty"`
	Output                *Output `json:"output,omitempty"`
	Checksum              string  `json:"checksum,omitempty"`
	Info                  *Info   `json:"info,omitempty"`
	RuntimeEnvironmentKey string  `json:"runtime_environment_key,omitempty"`
}

// Variable is one job variable.
type Variable struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Public bool   `json:"public"`
	File   bool   `json:"file"`
	Masked bool   `json:"masked"`
	Raw    bool   `json:"raw"`
}

// JobInfo is the job_info object of the payload.
type JobInfo struct {
	Name                                  string  `json:"name"`
	Stage                                 string  `json:"stage"`
	ProjectID                             int64   `json:"project_id"`
	ProjectName                           string  `json:"project_name"`
	ProjectFullPath                       string  `json:"project_full_path,omitempty"`
	PipelineID                            int64   `json:"pipeline_id"`
	NamespaceID                           int64   `json:"namespace_id,omitempty"`
	RootNamespaceID                       int64   `json:"root_namespace_id,omitempty"`
	OrganizationID                        int64   `json:"organization_id,omitempty"`
	UserID                                int64   `json:"user_id,omitempty"`
	InstanceID                            string  `json:"instance_id,omitempty"`
	InstanceUUID                          string  `json:"instance_uuid,omitempty"`
	QueueSize                             int64   `json:"queue_size"`
	QueueDepth                            int64   `json:"queue_depth"`
	TimeInQueueSeconds                    float64 `json:"time_in_queue_seconds"`
	ProjectJobsRunningOnInstanceRunnersCt string  `json:"project_jobs_running_on_instance_runners_count,omitempty"`
}

// GitInfo is the git_info object of the payload.
type GitInfo struct {
	RepoURL          string   `json:"repo_url"`
	RepoObjectFormat string   `json:"repo_object_format,omitempty"`
	Ref              string   `json:"ref"`
	Sha              string   `json:"sha"`
	BeforeSha        string   `json:"before_sha"`
	RefType          string   `json:"ref_type"`
	Refspecs         []string `json:"refspecs"`
	Depth            int      `json:"depth"`
	Protected        *bool    `json:"protected"`
	// RefsDigest (a Berth extension; GitLab sends none) names the state of
	// the refs the job's fetch reads on the coordinator: a runner whose
	// build directory was fetched with the same digest, and whose refs
	// there are unchanged since, skips the fetch (docs/runner.md).
	RefsDigest string `json:"berth_refs_digest,omitempty"`
}

// RunnerInfo is the runner_info object of the payload.
type RunnerInfo struct {
	UUID    string `json:"uuid,omitempty"`
	Timeout int    `json:"timeout"`
}

// Step is one entry of steps (script, after_script, release, ...).
type Step struct {
	Name         string   `json:"name"`
	Script       []string `json:"script"`
	Timeout      int      `json:"timeout"`
	When         string   `json:"when"`
	AllowFailure bool     `json:"allow_failure"`
}

// Port is an image/service port.
type Port struct {
	Number   int    `json:"number"`
	Protocol string `json:"protocol,omitempty"`
	Name     string `json:"name,omitempty"`
}

// ExecutorOpts are image.executor_opts.
type ExecutorOpts struct {
	Docker     *DockerOpts     `json:"docker,omitempty"`
	Kubernetes *KubernetesOpts `json:"kubernetes,omitempty"`
}

// DockerOpts are executor_opts.docker.
type DockerOpts struct {
	Platform string     `json:"platform,omitempty"`
	User     FlexString `json:"user,omitempty"`
}

// KubernetesOpts are executor_opts.kubernetes.
type KubernetesOpts struct {
	User FlexString `json:"user,omitempty"`
}

// Image is the image object, and each entry of services.
type Image struct {
	Name         string        `json:"name"`
	Alias        string        `json:"alias,omitempty"`
	Command      []string      `json:"command,omitempty"`
	Entrypoint   []string      `json:"entrypoint,omitempty"`
	Ports        []Port        `json:"ports,omitempty"`
	Variables    []Variable    `json:"variables,omitempty"`
	PullPolicy   []string      `json:"pull_policy,omitempty"`
	ExecutorOpts *ExecutorOpts `json:"executor_opts,omitempty"`
}

// Artifact is one entry of artifacts.
type Artifact struct {
	Name           string   `json:"name"`
	Untracked      bool     `json:"untracked"`
	Paths          []string `json:"paths"`
	Exclude        []string `json:"exclude,omitempty"`
	When           string   `json:"when"`
	ArtifactType   string   `json:"artifact_type"`
	ArtifactFormat string   `json:"artifact_format"`
	ExpireIn       string   `json:"expire_in,omitempty"`
}

// Cache is one entry of cache.
type Cache struct {
	Key          string   `json:"key"`
	Untracked    bool     `json:"untracked"`
	Policy       string   `json:"policy"`
	Paths        []string `json:"paths"`
	When         string   `json:"when"`
	FallbackKeys []string `json:"fallback_keys,omitempty"`
}

// Credentials is one entry of credentials.
type Credentials struct {
	Type     string `json:"type"`
	URL      string `json:"url"`
	Username string `json:"username"`
	Password string `json:"password"`
}

// ArtifactsFile describes a dependency's archive.
type ArtifactsFile struct {
	Filename string `json:"filename"`
	Size     int64  `json:"size"`
}

// Dependency is one entry of dependencies.
type Dependency struct {
	ID            int64          `json:"id"`
	Token         string         `json:"token"`
	Name          string         `json:"name"`
	ArtifactsFile *ArtifactsFile `json:"artifacts_file,omitempty"`
}

// Hook is one entry of hooks.
type Hook struct {
	Name   string   `json:"name"`
	Script []string `json:"script"`
}

// JobFeatures is the features object of the payload.
type JobFeatures struct {
	TraceSections     bool     `json:"trace_sections"`
	TokenMaskPrefixes []string `json:"token_mask_prefixes,omitempty"`
	FailureReasons    []string `json:"failure_reasons,omitempty"`
	// Tracing asks the runner to trace the job with OpenTelemetry (GitLab
	// 18.x): its spans go under the span SpanParentID of trace TraceID
	// (hex) to the OTLP endpoints.
	Tracing *JobTracing `json:"tracing,omitempty"`
}

// JobTracing is features.tracing of the payload.
type JobTracing struct {
	TraceID       string         `json:"trace_id"`
	SpanParentID  string         `json:"span_parent_id"`
	OTELEndpoints []OTELEndpoint `json:"otel_endpoints"`
}

// OTELEndpoint is an OTLP endpoint of features.tracing: url's scheme is
// http or https (OTLP over HTTP, protobuf) or grpc or grpcs (OTLP over
// gRPC).
type OTELEndpoint struct {
	URL  string            `json:"url"`
	Auth *OTELEndpointAuth `json:"auth,omitempty"`
}

// OTELEndpointAuth is how the runner authenticates to an OTLP endpoint:
// Type http_bearer_gcp_oidc is a Google-signed ID token for Audience.
type OTELEndpointAuth struct {
	Type              string `json:"type"`
	HTTPBearerGCPOIDC *struct {
		Audience string `json:"audience"`
	} `json:"http_bearer_gcp_oidc,omitempty"`
}

// JobResponse is the job payload: the 201 body of POST /jobs/request.
type JobResponse struct {
	ID            int64           `json:"id"`
	Token         string          `json:"token"`
	AllowGitFetch bool            `json:"allow_git_fetch"`
	JobInfo       JobInfo         `json:"job_info"`
	GitInfo       GitInfo         `json:"git_info"`
	RunnerInfo    RunnerInfo      `json:"runner_info"`
	Variables     []Variable      `json:"variables"`
	Steps         []Step          `json:"steps,omitempty"`
	Run           string          `json:"run,omitempty"`
	Hooks         []Hook          `json:"hooks,omitempty"`
	Image         *Image          `json:"image,omitempty"`
	Services      []Image         `json:"services"`
	Artifacts     []Artifact      `json:"artifacts"`
	Cache         []Cache         `json:"cache"`
	Credentials   []Credentials   `json:"credentials"`
	Dependencies  []Dependency    `json:"dependencies"`
	Features      JobFeatures     `json:"features"`
	Secrets       json.RawMessage `json:"secrets,omitempty"`
}

// ErrorResponse is GitLab's error body.
type ErrorResponse struct {
	Message any `json:"message"`
}

// ExpandVariables expands $KEY and ${KEY} in s with the job's variables
// (unknown keys expand to nothing), as GitLab's runner expands image and
// service names; j may be nil.
func (j *JobResponse) ExpandVariables(s string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	vals := map[string]string{}
	if j != nil {
		for _, v := range j.Variables {
			vals[v.Key] = v.Value
		}
	}
	return os.Expand(s, func(k string) string { return vals[k] })
}

// Fleet is a runner manager's report of its autoscaled fleet, a Berth
// extension (PUT /api/v4/berth/runners/fleet with the runner token, every
// 15 s from a manager whose executor autoscales): what the coordinator's
// web UI shows per runner manager. Counts are of the manager's instance
// group for this runner; the totals (Boots, Deletions, InstanceSeconds)
// run from Since, when the manager's autoscaler started.
type Fleet struct {
	SystemID string `json:"system_id"`
	Executor string `json:"executor,omitempty"`
	// Plugin names the fleeting plugin (the instance group's provider).
	Plugin string `json:"plugin,omitempty"`
	// Instances by phase: creating, booted, ready, removing, deleting.
	Creating int `json:"creating"`
	Booted   int `json:"booted"`
	Ready    int `json:"ready"`
	Removing int `json:"removing"`
	Deleting int `json:"deleting"`
	// MaxInstances is the most instances at once; Capacity the job slots
	// of one instance.
	MaxInstances int `json:"max_instances"`
	Capacity     int `json:"capacity_per_instance"`
	// SlotsInUse are slots holding a job; SlotsIdle free slots on ready
	// instances; IdleInstances ready instances holding no job; Waiting
	// jobs waiting for a slot.
	SlotsInUse    int `json:"slots_in_use"`
	SlotsIdle     int `json:"slots_idle"`
	IdleInstances int `json:"idle_instances"`
	Waiting       int `json:"waiting"`
	// Since Since: instances booted and deleted, and instance time
	// (InstanceSeconds; hours × the provider's hourly price is the cost).
	Since           time.Time `json:"since"`
	Boots           int64     `json:"boots"`
	Deletions       int64     `json:"deletions"`
	InstanceSeconds float64   `json:"instance_seconds"`
}

// Instances is the number of instances the fleet has in any phase.
func (f *Fleet) Instances() int { return f.Creating + f.Booted + f.Ready + f.Removing + f.Deleting }
