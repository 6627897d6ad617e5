// Package config loads, checks and writes the runner manager's config.toml
// with GitLab Runner's keys, so an existing gitlab-runner configuration
// loads as it is. Keys Berth does not support yet are reported as warnings
// by their full name (runners.docker.privileged), never silently ignored.
//
// Load once at the edge, call Validate (Load does), and hand the struct to
// the runner manager. Save rewrites the file atomically (temporary file in
// the same directory, fsync, rename, keeping the file mode) and keeps every
// key it does not know, so registering a runner or rotating a token never
// drops a [runners.docker] section written for a later Berth.
package config

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	econfig "github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/executor/slotcgroup"
	"github.com/berthci/berth/runner/network"
	"github.com/berthci/berth/taskscaler"
)

// Defaults of GitLab Runner for keys that are absent or zero.
const (
	DefaultConcurrent                     = 1
	DefaultCheckInterval                  = 3 * time.Second
	DefaultShutdownTimeout                = 30 * time.Second
	DefaultMetricsPort                    = "9252"
	DefaultRequestConcurrency             = 1
	DefaultOutputLimitKiB                 = 4096
	DefaultUnhealthyRequestsLimit         = 3
	DefaultUnhealthyInterval              = 60 * time.Minute
	DefaultJobStatusFinalUpdateRetryLimit = 10
	DefaultShell                          = "bash"
)

// Config is config.toml: the global section and the [[runners]] entries.
type Config struct {
	// Concurrent bounds the jobs running at once across all runners.
	Concurrent int `toml:"concurrent"`
	// CheckInterval is the poll interval in seconds (≤0: 3).
	CheckInterval int `toml:"check_interval"`
	// ShutdownTimeout is how many seconds a forceful shutdown waits for
	// jobs to report (default 30).
	ShutdownTimeout int `toml:"shutdown_timeout"`
	// ListenAddress is host:port of the Prometheus /metrics server; empty
	// disables it. A bare host gets port 9252.
	ListenAddress string `toml:"listen_address"`
	// LogLevel is debug, info, warn, error, fatal or panic.
	LogLevel string `toml:"log_level"`
	// LogFormat is runner (the default), text or json.
	LogFormat string `toml:"log_format"`
	// ConnectionMaxAge is gitlab-runner's connection_max_age: how long
	// the runner keeps reusing its idle connections to a coordinator
	// before closing them, so that new ones spread over the replicas
	// behind a load balancer and pick up rotated certificates (nil:
	// DefaultConnectionMaxAge; 0: forever).
	ConnectionMaxAge *time.Duration `toml:"connection_max_age"`
	// User is gitlab-runner's user: the shell executor runs jobs as this
	// user (the runner running as root); `berth runner run --user`
	// overrides it.
	User string `toml:"user"`
	// Labels are gitlab-runner's default runner labels for every entry
	// (an entry's own labels override them key by key): see
	// Runner.ComputedLabels.
	Labels map[string]string `toml:"labels"`

	Runners []*Runner `toml:"runners"`

	// raw is the document as loaded, so Save keeps keys Berth does not know.
	raw map[string]any
}

// Runner is one [[runners]] entry.
type Runner struct {
	Name            string    `toml:"name"`
	URL             string    `toml:"url"`
	ID              int64     `toml:"id"`
	Token           string    `toml:"token"`
	TokenObtainedAt time.Time `toml:"token_obtained_at"`
	TokenExpiresAt  time.Time `toml:"token_expires_at"`
	Executor        string    `toml:"executor"`
	// TLSCAFile, TLSCertFile and TLSKeyFile are GitLab's tls-ca-file (PEM
	// certificate authorities trusted for url beside the system's; jobs
	// get them as CI_SERVER_TLS_CA_FILE for git and the helper) and
	// tls-cert-file/tls-key-file (a client certificate).
	TLSCAFile   string `toml:"tls-ca-file"`
	TLSCertFile string `toml:"tls-cert-file"`
	TLSKeyFile  string `toml:"tls-key-file"`
	// DebugTraceDisabled refuses CI_DEBUG_TRACE (a job asking for it
	// runs without it, with a warning in its log).
	DebugTraceDisabled bool `toml:"debug_trace_disabled"`
	// CloneURL is GitLab's clone_url: the base URL jobs fetch the
	// project from (<clone_url>/<project path>.git) instead of the
	// repository URL in the payload, for runners that reach GitLab by
	// another address. Used only with a scheme (UsesCloneURL).
	CloneURL string `toml:"clone_url"`
	// SafeDirectoryCheckout marks the project directory safe for git
	// (git config --global --add safe.directory) before get_sources, so
	// git works in a checkout another user made (a job in another image
	// before); nil: on where the environment is the job's own (a
	// container, a VM: executor.Environment.Disposable), as
	// gitlab-runner's default is on for its docker and VM executors.
	SafeDirectoryCheckout *bool `toml:"safe_directory_checkout"`
	// CleanGitConfig is clean_git_config: get_sources and the job's
	// cleanup remove the repository's git configuration and hooks (its
	// submodules' too), where a job could leave commands for the next
	// one's git; nil: gitlab-runner's default, on except on the shell
	// executor and for GIT_STRATEGY none.
	CleanGitConfig *bool `toml:"clean_git_config"`
	// PrepareTimeout and GetSourcesTimeout are gitlab-runner's
	// prepare_timeout (the executor's preparation and the
	// prepare_script stage) and get_sources_timeout (the get_sources
	// stage, all its attempts); nil, 0 or more than the job's timeout:
	// the job's timeout.
	PrepareTimeout    *time.Duration `toml:"prepare_timeout"`
	GetSourcesTimeout *time.Duration `toml:"get_sources_timeout"`
	// Labels are the entry's runner labels (gitlab-runner's labels),
	// merged over the global ones: ComputedLabels.
	Labels map[string]string `toml:"labels"`
	// computedLabels is set by Config.Validate.
	computedLabels map[string]string
	// StrictCheckInterval: after a request that brought a job, wait
	// check_interval before the next one too (gitlab-runner's
	// strict_check_interval); by default the runner asks again at once.
	StrictCheckInterval bool `toml:"strict_check_interval"`
	// CustomBuildDir is [runners.custom_build_dir]: whether a job may
	// choose its project directory (GIT_CLONE_PATH).
	CustomBuildDir CustomBuildDir `toml:"custom_build_dir"`
	// CertsDir is the certificate directory beside config.toml (Load sets
	// it; not a key): TLSFiles takes the files not set above from it.
	CertsDir string `toml:"-"`
	// Limit bounds this runner's jobs (0: only concurrent applies).
	Limit int `toml:"limit"`
	// RequestConcurrency is how many jobs/request calls may be in flight
	// for this runner (0: 1).
	RequestConcurrency int      `toml:"request_concurrency"`
	BuildsDir          string   `toml:"builds_dir"`
	CacheDir           string   `toml:"cache_dir"`
	Shell              string   `toml:"shell"`
	Environment        []string `toml:"environment"`

	PreGetSourcesScript  string `toml:"pre_get_sources_script"`
	PostGetSourcesScript string `toml:"post_get_sources_script"`
	PreBuildScript       string `toml:"pre_build_script"`
	PostBuildScript      string `toml:"post_build_script"`

	// OutputLimit is the maximum job log size in KiB (0: 4096).
	OutputLimit  int             `toml:"output_limit"`
	FeatureFlags map[string]bool `toml:"feature_flags"`

	UnhealthyRequestsLimit         int           `toml:"unhealthy_requests_limit"`
	UnhealthyInterval              time.Duration `toml:"unhealthy_interval"`
	JobStatusFinalUpdateRetryLimit int           `toml:"job_status_final_update_retry_limit"`

	// Cache is [runners.cache], the distributed cache (nil: the local
	// cache_dir only).
	Cache *Cache `toml:"cache"`

	// Executor sections; nil when absent.
	Docker *Docker `toml:"docker"`
	SSH    *SSH    `toml:"ssh"`
	Custom *Custom `toml:"custom"`
	Plugin *Plugin `toml:"plugin"`
	// MicroVM is [runners.microvm], Berth's microvm executor.
	MicroVM *MicroVM `toml:"microvm"`
	// Autoscaler is [runners.autoscaler], for the instance and
	// docker-autoscaler executors.
	Autoscaler *taskscaler.Config `toml:"autoscaler"`

	// UseSlotCgroups runs each job of an autoscaled executor in its
	// slot's cgroup on the instance, named by SlotCgroupTemplate
	// (default gitlab-runner/slot-${slot}), with SlotCgroup's limits
	// ([runners.slot_cgroup], Berth's: GitLab sets none).
	UseSlotCgroups     bool               `toml:"use_slot_cgroups"`
	SlotCgroupTemplate string             `toml:"slot_cgroup_template"`
	SlotCgroup         *slotcgroup.Limits `toml:"slot_cgroup"`

	// raw is this entry as loaded (see Config.raw).
	raw map[string]any
}

// CheckIntervalDuration is check_interval with its default applied.
func (c *Config) CheckIntervalDuration() time.Duration {
	if c.CheckInterval <= 0 {
		return DefaultCheckInterval
	}
	return time.Duration(c.CheckInterval) * time.Second
}

// DefaultConnectionMaxAge is gitlab-runner's connection_max_age default.
const DefaultConnectionMaxAge = 15 * time.Minute

// EffectiveConnectionMaxAge is connection_max_age with its default
// applied (0: connections are kept).
func (c *Config) EffectiveConnectionMaxAge() time.Duration {
	if c.ConnectionMaxAge == nil {
		return DefaultConnectionMaxAge
	}
	return max(*c.ConnectionMaxAge, 0)
}

// ShutdownTimeoutDuration is shutdown_timeout with its default applied.
func (c *Config) ShutdownTimeoutDuration() time.Duration {
	if c.ShutdownTimeout <= 0 {
		return DefaultShutdownTimeout
	}
	return time.Duration(c.ShutdownTimeout) * time.Second
}

// MetricsAddress is listen_address with the default port applied, or ""
// when metrics are off.
func (c *Config) MetricsAddress() string {
	a := strings.TrimSpace(c.ListenAddress)
	if a == "" {
		return ""
	}
	if !strings.Contains(a, ":") {
		return a + ":" + DefaultMetricsPort
	}
	return a
}

// EffectiveRequestConcurrency is request_concurrency with its default.
func (r *Runner) EffectiveRequestConcurrency() int {
	if r.RequestConcurrency <= 0 {
		return DefaultRequestConcurrency
	}
	return r.RequestConcurrency
}

// OutputLimitBytes is output_limit in bytes with its default.
func (r *Runner) OutputLimitBytes() int {
	if r.OutputLimit <= 0 {
		return DefaultOutputLimitKiB * 1024
	}
	return r.OutputLimit * 1024
}

// EffectiveUnhealthyRequestsLimit is unhealthy_requests_limit with its default.
func (r *Runner) EffectiveUnhealthyRequestsLimit() int {
	if r.UnhealthyRequestsLimit <= 0 {
		return DefaultUnhealthyRequestsLimit
	}
	return r.UnhealthyRequestsLimit
}

// EffectiveUnhealthyInterval is unhealthy_interval with its default.
func (r *Runner) EffectiveUnhealthyInterval() time.Duration {
	if r.UnhealthyInterval <= 0 {
		return DefaultUnhealthyInterval
	}
	return r.UnhealthyInterval
}

// EffectiveFinalUpdateRetryLimit is job_status_final_update_retry_limit
// with its default.
func (r *Runner) EffectiveFinalUpdateRetryLimit() int {
	if r.JobStatusFinalUpdateRetryLimit <= 0 {
		return DefaultJobStatusFinalUpdateRetryLimit
	}
	return r.JobStatusFinalUpdateRetryLimit
}

// EffectiveShell is shell with its default (bash; the shell executor falls
// back to sh when bash is missing).
func (r *Runner) EffectiveShell() string {
	if r.Shell == "" {
		return DefaultShell
	}
	return r.Shell
}

// TLSFiles are the entry's TLS files for its coordinator: tls-ca-file,
// tls-cert-file and tls-key-file, and where one is not set, the
// coordinator host's file in CertsDir (<host>.crt, <host>.auth.crt,
// <host>.auth.key), as GitLab's runner reads its certs directory.
func (r *Runner) TLSFiles() network.TLSFiles {
	return network.TLSFiles{CAFile: r.TLSCAFile, CertFile: r.TLSCertFile, KeyFile: r.TLSKeyFile}.WithCertsDir(r.CertsDir, r.URL)
}

// UsesCloneURL reports whether clone_url is used: set, with a scheme, as
// gitlab-runner uses it.
func (r *Runner) UsesCloneURL() bool {
	u, err := url.Parse(r.CloneURL)
	return r.CloneURL != "" && err == nil && u.Scheme != ""
}

// CustomBuildDir is GitLab's [runners.custom_build_dir].
type CustomBuildDir struct {
	// Enabled lets jobs set GIT_CLONE_PATH (nil: the executor's default,
	// CustomBuildDirEnabled).
	Enabled *bool `toml:"enabled"`
}

// CustomBuildDirEnabled reports whether the entry's jobs may set
// GIT_CLONE_PATH: custom_build_dir's enabled, else GitLab's default for
// the executor — on where every job has an environment of its own
// (docker, docker-autoscaler, and Berth's microvm), off where jobs share
// a machine's directories (shell, ssh, custom, instance, plugins).
func (r *Runner) CustomBuildDirEnabled() bool {
	if r.CustomBuildDir.Enabled != nil {
		return *r.CustomBuildDir.Enabled
	}
	switch r.Executor {
	case "docker", "docker-autoscaler", "microvm":
		return true
	}
	return false
}

// CertsDirName is the certificate directory's name beside config.toml
// (GitLab's runner: /etc/gitlab-runner/certs).
const CertsDirName = "certs"

// FeatureFlag reports a feature flag from feature_flags.
func (r *Runner) FeatureFlag(name string) bool { return r.FeatureFlags[name] }

// TokenRotationAt is when the token should be reset: at 75 % of its life
// (token_obtained_at + 0.75 × (token_expires_at − token_obtained_at)).
// ok is false when the token never expires.
func (r *Runner) TokenRotationAt() (at time.Time, ok bool) {
	if r.TokenExpiresAt.IsZero() {
		return time.Time{}, false
	}
	obtained := r.TokenObtainedAt
	if obtained.IsZero() || obtained.After(r.TokenExpiresAt) {
		// Unknown start: rotate at 75 % of what we can see, i.e. now.
		return time.Time{}, true
	}
	life := r.TokenExpiresAt.Sub(obtained)
	return obtained.Add(life * 3 / 4), true
}

// SupportedExecutors are the executors this build of Berth can run.
var SupportedExecutors = []string{"shell", "docker", "ssh", "custom", "plugin", "instance", "docker-autoscaler", "microvm"}

// knownExecutors are GitLab's executors (accepted by the parser, refused
// by Validate until Berth supports them).
var knownExecutors = map[string]bool{
	"shell": true, "ssh": true, "docker": true, "docker-windows": true, "docker+machine": true,
	"docker-autoscaler": true, "instance": true, "kubernetes": true, "custom": true,
	"parallels": true, "virtualbox": true, "plugin": true, "microvm": true,
}

// FieldError is a problem with one key. Key is the full name with the
// index of the runner entry (runners[1].url); Load adds file and line.
type FieldError struct {
	File string
	Line int
	Key  string
	Msg  string
}

func (e *FieldError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(":")
		if e.Line > 0 {
			fmt.Fprintf(&b, "%d:", e.Line)
		}
		b.WriteString(" ")
	}
	b.WriteString(e.Key)
	b.WriteString(": ")
	b.WriteString(e.Msg)
	return b.String()
}

// Validate checks the configuration; every problem is a *FieldError,
// joined with errors.Join.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &FieldError{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	if c.Concurrent <= 0 {
		bad("concurrent", "must be greater than 0 (got %d)", c.Concurrent)
	}
	if c.ShutdownTimeout < 0 {
		bad("shutdown_timeout", "must not be negative")
	}
	switch strings.ToLower(c.LogLevel) {
	case "", "debug", "info", "warn", "warning", "error", "fatal", "panic":
	default:
		bad("log_level", "must be debug, info, warn, error, fatal or panic, not %q", c.LogLevel)
	}
	switch c.LogFormat {
	case "", "runner", "text", "json":
	default:
		bad("log_format", "must be runner, text or json, not %q", c.LogFormat)
	}
	validateLabels(c.Labels, "labels", bad)
	for i, r := range c.Runners {
		k := func(name string) string { return fmt.Sprintf("runners[%d].%s", i, name) }
		if r == nil {
			bad(fmt.Sprintf("runners[%d]", i), "is empty")
			continue
		}
		validateLabels(r.Labels, k("labels"), bad)
		labels := map[string]string{}
		maps.Copy(labels, c.Labels)
		maps.Copy(labels, r.Labels)
		if len(labels) > maxLabels {
			bad(k("labels"), "%d labels with the global ones, at most %d", len(labels), maxLabels)
		}
		r.computedLabels = nil
		if len(labels) > 0 {
			r.computedLabels = labels
		}
		if r.URL == "" {
			bad(k("url"), "is required")
		} else if u, err := url.Parse(r.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad(k("url"), "want http(s)://host[:port][/path], got %q", r.URL)
		}
		if r.Token == "" {
			bad(k("token"), "is required (run berth runner register)")
		}
		switch {
		case r.Executor == "":
			bad(k("executor"), "is required (supported: %s)", strings.Join(SupportedExecutors, ", "))
		case !knownExecutors[r.Executor]:
			bad(k("executor"), "unknown executor %q (supported: %s)", r.Executor, strings.Join(SupportedExecutors, ", "))
		}
		switch r.Shell {
		case "", "bash", "sh":
		case "cmd", "pwsh", "powershell":
			if Supported(r.Executor) {
				bad(k("shell"), "must be bash or sh for the %s executor, not %q", r.Executor, r.Shell)
			}
		default:
			bad(k("shell"), "must be bash or sh for the %s executor, not %q", r.Executor, r.Shell)
		}
		nonNeg := map[string]int{
			"limit": r.Limit, "request_concurrency": r.RequestConcurrency, "output_limit": r.OutputLimit,
			"unhealthy_requests_limit": r.UnhealthyRequestsLimit, "job_status_final_update_retry_limit": r.JobStatusFinalUpdateRetryLimit,
		}
		for _, name := range []string{"limit", "request_concurrency", "output_limit", "unhealthy_requests_limit", "job_status_final_update_retry_limit"} {
			if nonNeg[name] < 0 {
				bad(k(name), "must not be negative (got %d)", nonNeg[name])
			}
		}
		if r.UnhealthyInterval < 0 {
			bad(k("unhealthy_interval"), "must not be negative")
		}
		for j, e := range r.Environment {
			if name, _, ok := strings.Cut(e, "="); !ok || name == "" {
				bad(fmt.Sprintf("runners[%d].environment[%d]", i, j), "want KEY=VALUE, got %q", e)
			}
		}
		validateExecutorSections(r, bad, k)
		validateCache(r.Cache, bad, k)
		if !r.TokenExpiresAt.IsZero() && !r.TokenObtainedAt.IsZero() && r.TokenExpiresAt.Before(r.TokenObtainedAt) {
			bad(k("token_expires_at"), "is before token_obtained_at")
		}
	}
	return errors.Join(errs...)
}

// Runner labels as GitLab validates them (gitlab-runner's common/labels.go,
// GitLab's ci_runner_labels schema).
var (
	labelKeyRE   = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{2,64}$`)
	labelValueRE = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,256}$`)
)

// maxLabels bounds an entry's labels, the global ones included.
const maxLabels = 32

func validateLabels(labels map[string]string, key string, bad func(key, format string, args ...any)) {
	for _, name := range slices.Sorted(maps.Keys(labels)) {
		if !labelKeyRE.MatchString(name) {
			bad(key, "label name %q does not match %s", name, labelKeyRE)
		} else if v := labels[name]; !labelValueRE.MatchString(v) {
			bad(key+"."+name, "label value %q does not match %s", v, labelValueRE)
		}
	}
}

// ComputedLabels are the labels the entry reports to the coordinator in
// its requests' info: the global labels with the entry's own over them
// (nil when there are none, or before Validate).
func (r *Runner) ComputedLabels() map[string]string { return r.computedLabels }

// Supported reports whether this build of Berth runs jobs with executor.
// A [[runners]] entry with a GitLab executor Berth lacks loads (with a
// warning) but does not run jobs.
func Supported(executor string) bool {
	for _, e := range SupportedExecutors {
		if e == executor {
			return true
		}
	}
	return false
}

// expandEnv expands $VAR and ${VAR} in url and token, as gitlab-runner does.
func expandEnv(s string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	return os.ExpandEnv(s)
}

// The executors' sections, defined with the executors (executor/config)
// so that they need not import the runner.
type (
	Docker        = econfig.Docker
	DockerService = econfig.DockerService
	SSH           = econfig.SSH
	Custom        = econfig.Custom
	Plugin        = econfig.Plugin
	MicroVM       = econfig.MicroVM
	StringList    = econfig.StringList
)

// Pull policies (executor/config).
const (
	PullAlways       = econfig.PullAlways
	PullIfNotPresent = econfig.PullIfNotPresent
	PullNever        = econfig.PullNever
)

// unjoin lists the errors of an errors.Join.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// validPluginName reports whether name can be part of a file name
// (berth-executor-<name>).
func validPluginName(name string) bool {
	for i, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || (r == '.' && i > 0)
		if !ok {
			return false
		}
	}
	return name != ""
}

// validateExecutorSections checks the section of r's executor.
func validateExecutorSections(r *Runner, bad func(key, format string, args ...any), k func(string) string) {
	switch r.Executor {
	case "docker":
		d := r.Docker
		if d == nil {
			d = &econfig.Docker{}
		}
		for i, p := range d.PullPolicy {
			if !econfig.ValidPullPolicy(p) {
				bad(k(fmt.Sprintf("docker.pull_policy[%d]", i)), "must be always, if-not-present or never, not %q", p)
			}
		}
		for i, p := range d.AllowedPullPolicies {
			if !econfig.ValidPullPolicy(p) {
				bad(k(fmt.Sprintf("docker.allowed_pull_policies[%d]", i)), "must be always, if-not-present or never, not %q", p)
			}
		}
		if d.ShmSize < 0 {
			bad(k("docker.shm_size"), "must not be negative")
		}
		for i, v := range d.Volumes {
			if strings.TrimSpace(v) == "" {
				bad(k(fmt.Sprintf("docker.volumes[%d]", i)), "is empty")
			}
		}
		for i, s := range d.Services {
			if s.Name == "" {
				bad(k(fmt.Sprintf("docker.services[%d].name", i)), "is required")
			}
		}
	case "ssh":
		if r.SSH == nil || r.SSH.Host == "" {
			bad(k("ssh.host"), "is required for the ssh executor")
		}
		if r.SSH != nil && r.SSH.Port != "" {
			var p int
			if _, err := fmt.Sscanf(r.SSH.Port, "%d", &p); err != nil || p <= 0 || p > 65535 || fmt.Sprint(p) != r.SSH.Port {
				bad(k("ssh.port"), "want a port number, got %q", r.SSH.Port)
			}
		}
	case "instance", "docker-autoscaler":
		if r.UseSlotCgroups {
			tmpl := r.SlotCgroupTemplate
			if tmpl == "" {
				tmpl = slotcgroup.DefaultTemplate
			}
			if _, err := slotcgroup.Expand(tmpl, 0); err != nil {
				bad(k("slot_cgroup_template"), "%v", err)
			}
			if r.Docker != nil && r.Docker.ServiceSlotCgroupTemplate != "" {
				if _, err := slotcgroup.Expand(r.Docker.ServiceSlotCgroupTemplate, 0); err != nil {
					bad(k("docker.service_slot_cgroup_template"), "%v", err)
				}
			}
		}
		if r.SlotCgroup != nil {
			for _, e := range unjoin(r.SlotCgroup.Validate()) {
				if e == nil {
					continue
				}
				key, rest, ok := strings.Cut(e.Error(), ": ")
				if !ok {
					key, rest = "", e.Error()
				}
				bad(k(strings.TrimSuffix("slot_cgroup."+key, ".")), "%s", rest)
			}
		}
		if r.Autoscaler == nil || r.Autoscaler.Plugin == "" {
			bad(k("autoscaler.plugin"), "is required for the %s executor (a fleeting plugin: a path, a fleeting-plugin-* name in PATH, or an installed reference)", r.Executor)
			break
		}
		if vi, err := econfig.ParseVMIsolation(r.Autoscaler.VMIsolation); err != nil {
			// "vm_isolation.<key>: <problem>"
			key, msg, ok := strings.Cut(err.Error(), ": ")
			if !ok {
				key, msg = "vm_isolation", err.Error()
			}
			bad(k("autoscaler."+key), "%s", msg)
		} else if vi.Enabled {
			switch {
			case r.Executor != "instance":
				bad(k("autoscaler.vm_isolation.enabled"), "VMs per slot are for the instance executor, not %s", r.Executor)
			case vi.NestingHost == "":
				bad(k("autoscaler.vm_isolation.nesting_host"), "is required: the nesting daemon's socket on the instances (unix:///path)")
			}
		}
		a := *r.Autoscaler
		a.SetDefaults()
		if err := a.Validate(); err != nil {
			for _, e := range unjoin(err) {
				// taskscaler names keys "runners.autoscaler.<key>".
				msg := e.Error()
				key, rest, ok := strings.Cut(strings.TrimPrefix(msg, "runners.autoscaler."), ": ")
				if !ok {
					key, rest = "", msg
				}
				bad(k(strings.TrimSuffix("autoscaler."+key, ".")), "%s", rest)
			}
		}
	case "microvm":
		if m := r.MicroVM; m != nil {
			for i, pat := range m.AllowedImages {
				if _, err := path.Match(pat, ""); err != nil {
					bad(k(fmt.Sprintf("microvm.allowed_images[%d]", i)), "%q: %v", pat, err)
				}
			}
		}
	case "plugin":
		pl := r.Plugin
		switch {
		case pl == nil || (pl.Name == "" && pl.Path == ""):
			bad(k("plugin"), "name or path is required for the plugin executor")
		case pl.Name != "" && pl.Path != "":
			bad(k("plugin"), "set name or path, not both")
		case pl.Name != "" && !validPluginName(pl.Name):
			bad(k("plugin.name"), "want letters, digits, '.', '_' or '-', got %q", pl.Name)
		}
		if pl != nil && pl.StartTimeout < 0 {
			bad(k("plugin.start_timeout"), "must not be negative")
		}
	case "custom":
		if r.Custom == nil || r.Custom.RunExec == "" {
			bad(k("custom.run_exec"), "is required for the custom executor")
		}
	}
}
