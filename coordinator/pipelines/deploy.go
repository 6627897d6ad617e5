package pipelines

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"regexp"
	"strings"
	"time"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// Environments and deployments, as GitLab records them:
//
//   - a job with environment (action start, the default) has a deployment
//     whose status follows the job's: created while it waits, running,
//     then success, failed, canceled or skipped; a retry is a new job and
//     a new deployment. The environment is created with the first
//     deployment to its name; a successful deployment makes it available
//     again, sets its URL and, with auto_stop_in, when it stops itself.
//   - a job with action stop stops its environment when it succeeds;
//     prepare, verify and access do not deploy.
//   - stopping an environment (auto_stop_in, the API) plays the on_stop
//     job of its last deployment when there is one, else stops it.
//
// The engine keeps deployments in step with their jobs (syncDeployments),
// so every way a job's status changes (runner, reaper, cancel, retry) is
// covered by the one place that sees them all.

// EnvironmentSlug is GitLab's CI_ENVIRONMENT_SLUG: lower case letters,
// digits and '-', starting with a letter, at most 24 bytes, with a
// suffix derived from the name when the name had to change.
func EnvironmentSlug(name string) string {
	b := []byte(strings.ToLower(name))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	s := string(b)
	if s == "" || !(s[0] >= 'a' && s[0] <= 'z') {
		s = "env-" + s
	}
	for strings.Contains(s, "--") {
		s = strings.ReplaceAll(s, "--", "-")
	}
	if len(s) > 24 || s != name {
		if len(s) > 17 {
			s = s[:17]
		}
		if !strings.HasSuffix(s, "-") {
			s += "-"
		}
		sum := sha256.Sum256([]byte(name))
		n, _ := new(big.Int).SetString(hex.EncodeToString(sum[:]), 16)
		b36 := n.Text(36)
		return s + b36[len(b36)-6:]
	}
	return strings.TrimSuffix(s, "-")
}

// The tier GitLab guesses from an environment's name when
// deployment_tier is not given, in GitLab's order.
var tierGuesses = []struct {
	re   *regexp.Regexp
	tier string
}{
	{regexp.MustCompile(`(?i)(dev|review|trunk)`), "development"},
	{regexp.MustCompile(`(?i)(test|tst|int|ac(ce|)pt|qa|qc|control|quality)`), "testing"},
	{regexp.MustCompile(`(?i)(st(a|)g|mod(e|)l|pre|demo|non)`), "staging"},
	{regexp.MustCompile(`(?i)(pr(o|)d|live)`), "production"},
}

func guessTier(name string) string {
	for _, g := range tierGuesses {
		if g.re.MatchString(name) {
			return g.tier
		}
	}
	return "other"
}

// jobEnvironment expands a job's environment keyword with the variables
// the job is created with and returns it with the CI_ENVIRONMENT_*
// variables GitLab gives the job.
func jobEnvironment(e *ci.Environment, vars map[string]string) (*graph.Env, []runnerapi.Variable) {
	if e == nil {
		return nil, nil
	}
	g := &graph.Env{Name: strings.TrimSpace(dispatch.ExpandString(e.Name, vars)), Action: e.Action, OnStop: e.OnStop,
		AutoStopIn: strings.TrimSpace(dispatch.ExpandString(e.AutoStopIn, vars))}
	if g.Action == "" {
		g.Action = "start"
	}
	g.Slug = EnvironmentSlug(g.Name)
	g.Tier, g.TierSet = e.DeploymentTier, e.DeploymentTier != ""
	if g.Tier == "" {
		g.Tier = guessTier(g.Name)
	}
	with := map[string]string{"CI_ENVIRONMENT_NAME": g.Name, "CI_ENVIRONMENT_SLUG": g.Slug}
	for k, v := range vars {
		if _, ok := with[k]; !ok {
			with[k] = v
		}
	}
	g.URL = dispatch.ExpandString(e.URL, with)
	pub := func(k, v string) runnerapi.Variable { return runnerapi.Variable{Key: k, Value: v, Public: true} }
	out := []runnerapi.Variable{pub("CI_ENVIRONMENT_NAME", g.Name), pub("CI_ENVIRONMENT_SLUG", g.Slug)}
	if g.URL != "" {
		out = append(out, pub("CI_ENVIRONMENT_URL", g.URL))
	}
	out = append(out, pub("CI_ENVIRONMENT_ACTION", g.Action), pub("CI_ENVIRONMENT_TIER", g.Tier))
	return g, out
}

// deploymentStatus is the deployment status of a job status (GitLab's
// mapping: a job that waits has a created deployment).
func deploymentStatus(st store.Status) string {
	switch st {
	case store.StatusRunning, store.StatusCanceling:
		return "running"
	case store.StatusSuccess, store.StatusFailed, store.StatusCanceled, store.StatusSkipped:
		return string(st)
	}
	return "created"
}

// syncDeployments brings the deployments and environments of a pipeline's
// jobs in step with the jobs' statuses. Engine goroutine; idempotent.
func (s *Engine) syncDeployments(ctx context.Context, p *store.Pipeline, nodes []*graph.Node, byID map[int64]*store.Job) error {
	var deps map[int64]*store.Deployment
	for _, n := range nodes {
		env := n.Graph.Env
		if env == nil || env.Name == "" {
			continue
		}
		j := byID[n.ID]
		if !env.Deploys() {
			if env.Action == "stop" && j.Status == store.StatusSuccess {
				if err := s.environmentStopped(ctx, p.ProjectID, env.Name, j); err != nil {
					return err
				}
			}
			continue
		}
		if deps == nil {
			list, err := s.store.ListDeployments(ctx, store.DeploymentFilter{PipelineID: p.ID})
			if err != nil {
				return err
			}
			deps = map[int64]*store.Deployment{}
			for _, d := range list {
				deps[d.JobID] = d
			}
		}
		if err := s.syncDeployment(ctx, p, j, env, deps[j.ID]); err != nil {
			return fmt.Errorf("deployment of job %d: %w", j.ID, err)
		}
	}
	return nil
}

func (s *Engine) syncDeployment(ctx context.Context, p *store.Pipeline, j *store.Job, g *graph.Env, d *store.Deployment) error {
	now := s.clock.Now().UTC()
	status := deploymentStatus(j.Status)
	var finished time.Time
	if j.Status.Finished() {
		finished = j.FinishedAt
		if finished.IsZero() {
			finished = now
		}
	}
	if d == nil {
		env := &store.Environment{ProjectID: p.ProjectID, Name: g.Name, Slug: g.Slug, ExternalURL: g.URL, Tier: g.Tier,
			State: store.EnvironmentAvailable, CreatedAt: now, UpdatedAt: now}
		created, err := s.store.EnsureEnvironment(ctx, env)
		if err != nil {
			return err
		}
		if created {
			s.log.Info("environment created", "project_id", p.ProjectID, "environment", env.Name, "tier", env.Tier)
		}
		d = &store.Deployment{ProjectID: p.ProjectID, EnvironmentID: env.ID, JobID: j.ID, PipelineID: p.ID, Ref: p.Ref, Tag: p.Tag,
			Sha: p.Sha, Status: "created", OnStop: g.OnStop, AutoStopIn: g.AutoStopIn, CreatedAt: now, UpdatedAt: now}
		if err := s.store.CreateDeployment(ctx, d); errors.Is(err, store.ErrExists) {
			return nil // another pass made it; the next one updates it
		} else if err != nil {
			return err
		}
	}
	if d.Status == status {
		return nil
	}
	nd, err := s.store.UpdateDeployment(ctx, d.ID, store.DeploymentUpdate{Status: status, UpdatedAt: now, FinishedAt: finished})
	if err != nil {
		return err
	}
	s.log.Info("deployment", "deployment_id", nd.ID, "job_id", j.ID, "status", status)
	if status != "success" {
		return nil
	}
	env, err := s.store.GetEnvironment(ctx, nd.EnvironmentID)
	if err != nil {
		return err
	}
	env.State, env.UpdatedAt, env.AutoStopAt = store.EnvironmentAvailable, now, time.Time{}
	if g.URL != "" {
		env.ExternalURL = g.URL
	}
	if g.TierSet {
		env.Tier = g.Tier
	}
	if g.AutoStopIn != "" && g.AutoStopIn != "never" {
		if dur, err := ci.ParseDuration(g.AutoStopIn); err == nil {
			env.AutoStopAt = finished.Add(dur)
		}
	}
	return s.store.UpdateEnvironment(ctx, env)
}

// environmentStopped marks a project's environment stopped after its stop
// job succeeded, unless it was deployed again since.
func (s *Engine) environmentStopped(ctx context.Context, projectID int64, name string, stopJob *store.Job) error {
	env, err := s.environmentByName(ctx, projectID, name)
	if err != nil || env == nil || env.State == store.EnvironmentStopped {
		return err
	}
	last, err := s.LastDeployment(ctx, env.ID)
	if err != nil {
		return err
	}
	if last != nil && deployedSince(last, stopJob) {
		return nil // deployed again after the stop job ran
	}
	env.State, env.AutoStopAt, env.UpdatedAt = store.EnvironmentStopped, time.Time{}, s.clock.Now().UTC()
	if err := s.store.UpdateEnvironment(ctx, env); err != nil {
		return err
	}
	s.log.Info("environment stopped", "project_id", projectID, "environment", name, "job_id", stopJob.ID)
	return nil
}

// deployedSince reports whether deployment d came after stop job stop
// ran: it finished later, or at the same instant (times are as coarse as
// the store keeps them, and a fast retry finishes within the same one) by
// a job made after the stop job.
func deployedSince(d *store.Deployment, stop *store.Job) bool {
	return d.FinishedAt.After(stop.FinishedAt) || d.FinishedAt.Equal(stop.FinishedAt) && d.JobID > stop.ID
}

func (s *Engine) environmentByName(ctx context.Context, projectID int64, name string) (*store.Environment, error) {
	envs, err := s.store.ListEnvironments(ctx, projectID)
	if err != nil {
		return nil, err
	}
	for _, e := range envs {
		if e.Name == name {
			return e, nil
		}
	}
	return nil, nil
}

// LastDeployment is an environment's latest successful deployment, or nil.
func (s *Engine) LastDeployment(ctx context.Context, envID int64) (*store.Deployment, error) {
	ds, err := s.store.ListDeployments(ctx, store.DeploymentFilter{EnvironmentID: envID, Statuses: []string{"success"}})
	if err != nil || len(ds) == 0 {
		return nil, err
	}
	return ds[len(ds)-1], nil
}

// StopEnvironment stops an environment as GitLab does: it plays the
// on_stop job of the environment's last deployment when that job can be
// played (the job then stops the environment when it succeeds); without
// one the environment is stopped at once. It returns the environment.
func (s *Engine) StopEnvironment(ctx context.Context, id int64) (*store.Environment, error) {
	env, err := s.store.GetEnvironment(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("environment %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	last, err := s.LastDeployment(ctx, env.ID)
	if err != nil {
		return nil, err
	}
	if last != nil && last.OnStop != "" {
		jobs, err := s.store.ListJobs(ctx, store.JobFilter{PipelineID: last.PipelineID})
		if err != nil {
			return nil, err
		}
		if j := latestByName(jobs)[last.OnStop]; j != nil {
			if _, err := s.PlayJob(ctx, j.ID); err == nil {
				s.log.Info("environment stopping: on_stop job played", "environment_id", env.ID, "job_id", j.ID)
				// Not again by auto-stop; the job stops it.
				env.AutoStopAt, env.UpdatedAt = time.Time{}, s.clock.Now().UTC()
				return env, s.store.UpdateEnvironment(ctx, env)
			} else if !errors.Is(err, ErrNotAllowed) {
				return nil, err
			}
		}
	}
	env.State, env.AutoStopAt, env.UpdatedAt = store.EnvironmentStopped, time.Time{}, s.clock.Now().UTC()
	if err := s.store.UpdateEnvironment(ctx, env); err != nil {
		return nil, err
	}
	s.log.Info("environment stopped", "environment_id", env.ID)
	return env, nil
}

// AutoStopEnvironments stops the environments whose auto_stop_in passed
// (reaper).
func (s *Engine) AutoStopEnvironments(ctx context.Context, now time.Time) error {
	due, err := s.store.DueEnvironments(ctx, now, 100)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range due {
		if _, err := s.StopEnvironment(ctx, e.ID); err != nil {
			errs = append(errs, fmt.Errorf("auto-stopping environment %d: %w", e.ID, err))
		}
	}
	return errors.Join(errs...)
}
