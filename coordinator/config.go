package coordinator

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/webui"
)

// Config configures the coordinator. Load it once at the edge, then
// Validate it; zero durations and sizes take the defaults of Defaults.
type Config struct {
	// ExternalURL is how runners and jobs reach this coordinator
	// (CI_SERVER_URL, artifact and repository URLs).
	ExternalURL string
	// LongPollTimeout is how long a jobs/request whose last_update is
	// current is held waiting for a job (GitLab Workhorse: 50 s).
	LongPollTimeout time.Duration
	// TraceUpdateInterval is sent as X-GitLab-Trace-Update-Interval.
	TraceUpdateInterval time.Duration
	// AckTimeout: a job handed out but not acknowledged (PUT
	// state=running) within this time goes back to the queue.
	AckTimeout time.Duration
	// StuckTimeout: a running job without any update for this long fails
	// with no_updates_running.
	StuckTimeout time.Duration
	// CancelingTimeout: a canceling job without any update for this long
	// becomes canceled (no_updates_canceling).
	CancelingTimeout time.Duration
	// PendingTimeout: a job nobody picked up for this long fails with
	// stuck_or_timeout_failure.
	PendingTimeout time.Duration
	// TimeoutGrace is added to a job's timeout before the server itself
	// fails a running job with job_execution_timeout (the runner enforces
	// the timeout; this catches runners that vanished).
	TimeoutGrace time.Duration
	// FinalTraceWait bounds how long a final update is answered 202 while
	// the trace it announces has not fully arrived.
	FinalTraceWait time.Duration
	// RunnerTokenExpiresIn gives runner authentication tokens an expiry
	// (0: never expire).
	RunnerTokenExpiresIn time.Duration
	// MaxArtifactSize limits one artifact upload, in bytes.
	MaxArtifactSize int64
	// MaxSnapshotSize limits one upload of a VM snapshot, a failed
	// job's or a snapshot point's (artifact_type berth_snapshot,
	// berth_snapshot_<point>: memory and disk, larger than other
	// artifacts), in bytes.
	MaxSnapshotSize int64
	// MaxSnapshotAge bounds how long a VM snapshot is kept, whatever its
	// expire_in says (a snapshot holds what the job had in memory: it
	// never lives forever).
	MaxSnapshotAge time.Duration
	// MaxTraceSize limits a job's whole log, in bytes (GitLab's
	// ci_jobs_trace_size_limit, 100 MiB). A PATCH past it fails the job
	// with trace_size_exceeded and answers 403, as GitLab does.
	MaxTraceSize int64
	// TraceArchiveAfter is how long after a job finished its log moves
	// from the store to the artifact storage (0: Defaults; negative:
	// never).
	TraceArchiveAfter time.Duration
	// DefaultJobTimeout applies to jobs whose spec has none, in seconds.
	DefaultJobTimeout int
	// ReapInterval is how often timeouts and expiries are enforced.
	ReapInterval time.Duration
	// RegistrationDisabled makes POST /runners answer 410, as GitLab does
	// when registration tokens are disabled.
	RegistrationDisabled bool
	// RepoDir holds the projects' bare git repositories (ID.git). Empty:
	// "repos" beside the artifact directory when artifacts are stored in a
	// local directory; otherwise git hosting is off.
	RepoDir string
	// NoGitHosting turns git hosting off whatever RepoDir says: of the
	// replicas sharing a store, one hosts the repositories (see
	// docs/coordinator.md, "Replicas").
	NoGitHosting bool
	// PagesDir holds the projects' published GitLab Pages sites. Empty:
	// "pages" beside the artifact directory when artifacts are stored in a
	// local directory; otherwise Pages jobs run but publish nothing.
	PagesDir string
	// GitDepth is git_info.depth of pipeline jobs (GitLab's project
	// default: 20); -1 means a full clone.
	GitDepth int
	// MaxPipelineHierarchySize bounds a tree of pipelines linked by
	// trigger jobs (GitLab's pipeline_hierarchy_size limit, default
	// 1000): a bridge whose tree already holds this many pipelines fails
	// with reached_max_pipeline_hierarchy_size.
	MaxPipelineHierarchySize int
	// CellID is the cell this coordinator (and its replicas) serves
	// (docs/cells.md): its runner, registration and admin tokens and its
	// job tokens carry it, so a router finds the cell without a database,
	// and job tokens of other cells are refused. 0: not part of cells
	// (tokens carry no cell).
	CellID int64
	// Includes configures how CI includes that are not in the commit
	// (project, remote, template, component) are resolved.
	Includes pipelines.IncludeConfig
	// UI configures the web UI (coordinator/webui), served at / beside
	// the APIs.
	UI webui.Config
	// OTELEndpoints are OTLP endpoints (http, https, grpc or grpcs URLs)
	// pipelines are traced to (coordinator/tracing, docs/tracing.md);
	// none: no tracing.
	OTELEndpoints []string
}

// Defaults are the values zero fields take.
var Defaults = Config{
	ExternalURL:         "http://127.0.0.1:8080",
	LongPollTimeout:     50 * time.Second,
	TraceUpdateInterval: 3 * time.Second,
	AckTimeout:          5 * time.Minute,
	StuckTimeout:        time.Hour,
	CancelingTimeout:    time.Hour,
	PendingTimeout:      24 * time.Hour,
	TimeoutGrace:        5 * time.Minute,
	FinalTraceWait:      5 * time.Minute,
	MaxArtifactSize:     100 << 20,
	MaxSnapshotSize:     4 << 30,
	MaxSnapshotAge:      30 * 24 * time.Hour,
	MaxTraceSize:        100 << 20,
	DefaultJobTimeout:   3600,
	ReapInterval:        15 * time.Second,
	TraceArchiveAfter:   time.Minute,
	GitDepth:            20,

	MaxPipelineHierarchySize: 1000,
}

// withDefaults returns c with zero fields set from Defaults.
func (c Config) withDefaults() Config {
	d := Defaults
	if c.ExternalURL == "" {
		c.ExternalURL = d.ExternalURL
	}
	setDur := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	setDur(&c.LongPollTimeout, d.LongPollTimeout)
	setDur(&c.TraceUpdateInterval, d.TraceUpdateInterval)
	setDur(&c.AckTimeout, d.AckTimeout)
	setDur(&c.StuckTimeout, d.StuckTimeout)
	setDur(&c.CancelingTimeout, d.CancelingTimeout)
	setDur(&c.PendingTimeout, d.PendingTimeout)
	setDur(&c.TimeoutGrace, d.TimeoutGrace)
	setDur(&c.FinalTraceWait, d.FinalTraceWait)
	setDur(&c.ReapInterval, d.ReapInterval)
	setDur(&c.TraceArchiveAfter, d.TraceArchiveAfter)
	if c.MaxArtifactSize == 0 {
		c.MaxArtifactSize = d.MaxArtifactSize
	}
	if c.MaxSnapshotAge == 0 {
		c.MaxSnapshotAge = d.MaxSnapshotAge
	}
	if c.MaxSnapshotSize == 0 {
		c.MaxSnapshotSize = d.MaxSnapshotSize
	}
	if c.MaxTraceSize == 0 {
		c.MaxTraceSize = d.MaxTraceSize
	}
	if c.DefaultJobTimeout == 0 {
		c.DefaultJobTimeout = d.DefaultJobTimeout
	}
	if c.GitDepth == 0 {
		c.GitDepth = d.GitDepth
	}
	if c.MaxPipelineHierarchySize <= 0 {
		c.MaxPipelineHierarchySize = d.MaxPipelineHierarchySize
	}
	c.Includes = c.Includes.WithDefaults()
	return c
}

// Validate checks the configuration (after defaults are applied).
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	u, err := url.Parse(c.ExternalURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("external URL %q: want http(s)://host[:port]", c.ExternalURL))
	}
	for name, d := range map[string]time.Duration{
		"long poll timeout": c.LongPollTimeout, "trace update interval": c.TraceUpdateInterval,
		"ack timeout": c.AckTimeout, "stuck timeout": c.StuckTimeout, "canceling timeout": c.CancelingTimeout,
		"pending timeout": c.PendingTimeout, "timeout grace": c.TimeoutGrace, "final trace wait": c.FinalTraceWait,
		"reap interval": c.ReapInterval, "runner token expiry": c.RunnerTokenExpiresIn,
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative (got %s)", name, d))
		}
	}
	if c.TraceUpdateInterval < time.Second {
		errs = append(errs, fmt.Errorf("trace update interval must be at least 1s (got %s)", c.TraceUpdateInterval))
	}
	if c.MaxTraceSize < 0 {
		errs = append(errs, errors.New("max trace size must not be negative"))
	}
	if c.MaxArtifactSize < 0 {
		errs = append(errs, fmt.Errorf("max artifact size must not be negative"))
	}
	if c.MaxSnapshotSize < 0 {
		errs = append(errs, fmt.Errorf("max snapshot size must not be negative"))
	}
	if c.GitDepth < -1 {
		errs = append(errs, fmt.Errorf("git depth must be -1 (full clone) or more"))
	}
	if c.CellID < 0 {
		errs = append(errs, fmt.Errorf("cell id must be positive (or 0: no cell), not %d", c.CellID))
	}
	if c.DefaultJobTimeout < 0 {
		errs = append(errs, fmt.Errorf("default job timeout must not be negative"))
	}
	errs = append(errs, c.Includes.Validate()...)
	return errors.Join(errs...)
}
