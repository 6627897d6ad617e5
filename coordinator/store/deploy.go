package store

import "time"

// Environment is a project's deployment target, as GitLab's environments:
// created by the first deployment to its name, stopped by a job with
// environment:action stop (or when AutoStopAt passes).
type Environment struct {
	ID        int64
	ProjectID int64
	// Name is unique in the project; Slug is GitLab's slug of it.
	Name        string
	Slug        string
	ExternalURL string
	// Tier is production, staging, testing, development or other.
	Tier string
	// State is available or stopped.
	State string
	// AutoStopAt is when the environment stops by itself (zero: never).
	AutoStopAt time.Time
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// Environment states.
const (
	EnvironmentAvailable = "available"
	EnvironmentStopped   = "stopped"
)

// Deployment is one job's deployment to an environment. Its status
// follows the job's: created, running, success, failed, canceled or
// skipped (GitLab's names).
type Deployment struct {
	ID            int64
	IID           int64 // per project, from 1
	ProjectID     int64
	EnvironmentID int64
	JobID         int64 // unique: a job deploys once (a retry is a new job)
	PipelineID    int64
	Ref           string
	Tag           bool
	Sha           string
	Status        string
	// OnStop names the job of the deployment's pipeline that stops its
	// environment (environment:on_stop).
	OnStop string
	// AutoStopIn is environment:auto_stop_in as written ("" : none).
	AutoStopIn string
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt time.Time
}

// DeploymentFilter selects deployments for ListDeployments. Zero fields
// do not filter.
type DeploymentFilter struct {
	ProjectID     int64
	EnvironmentID int64
	PipelineID    int64
	Statuses      []string
}

// DeploymentUpdate is applied by UpdateDeployment: Status and UpdatedAt
// are always set, FinishedAt when not zero.
type DeploymentUpdate struct {
	Status     string
	UpdatedAt  time.Time
	FinishedAt time.Time
}

// Release is a project's release of a tag.
type Release struct {
	ID          int64
	ProjectID   int64
	TagName     string // unique in the project
	Name        string
	Description string
	Sha         string // the commit the tag points to
	Milestones  []string
	Links       []ReleaseLink
	// JobID is the job that created it (0: another way).
	JobID      int64
	ReleasedAt time.Time
	CreatedAt  time.Time
}

// ReleaseLink is a release's asset link.
type ReleaseLink struct {
	ID              int64  `json:"id"` // 1-based, in the release
	Name            string `json:"name"`
	URL             string `json:"url"`
	LinkType        string `json:"link_type"`
	DirectAssetPath string `json:"direct_asset_path,omitempty"`
}

// PagesDeployment is a published GitLab Pages site of a project: the main
// one (PathPrefix "") or a parallel one under a path prefix. A project has
// at most one per prefix.
type PagesDeployment struct {
	ID         int64
	ProjectID  int64
	JobID      int64
	PathPrefix string
	// Dir names the deployment's directory in the coordinator's pages
	// storage.
	Dir       string
	Size      int64 // bytes of the files
	FileCount int
	ExpireAt  time.Time // zero: never
	CreatedAt time.Time
}
