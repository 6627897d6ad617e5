package pipelines

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
	_ "time/tzdata" // schedules name IANA zones; hosts without tzdata too

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/internal/cron"
)

// Pipeline schedules: a pipeline on a ref at every minute a cron
// expression matches in a time zone (GitLab's pipeline schedules). The
// leading replica's reaper calls RunDueSchedules; each run is claimed by
// moving the schedule's NextRunAt with a write conditional on the version
// read, so however many replicas or rounds see it due, it runs once. A run
// is claimed before its pipeline is created: a coordinator that stops in
// between skips that run (at most once), and one that was down over
// several runs makes one when it is back, then goes on from the clock.

// SourceSchedule is CI_PIPELINE_SOURCE of a scheduled pipeline.
const SourceSchedule = "schedule"

// dueBatch bounds the schedules one round runs.
const dueBatch = 100

// scheduleRunTimeout bounds the creation of one claimed run's pipeline
// (reading the repository, remote includes).
const scheduleRunTimeout = time.Minute

// ValidationError lists what is wrong with a request, field by field, as
// GitLab's validation errors do ({"message": {"cron": ["..."]}}).
type ValidationError struct{ Fields map[string][]string }

func (e *ValidationError) Error() string {
	keys := make([]string, 0, len(e.Fields))
	for k := range e.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		for _, m := range e.Fields[k] {
			parts = append(parts, k+" "+m)
		}
	}
	return strings.Join(parts, "; ")
}

// NextRun is the next minute after t that a schedule's cron expression
// matches in its time zone, in UTC. A *ValidationError says what is wrong
// with the expression or the zone, or that the expression never matches
// again.
func NextRun(expr, zone string, t time.Time) (time.Time, error) {
	ve := &ValidationError{Fields: map[string][]string{}}
	c, err := cron.Parse(expr)
	if err != nil {
		ve.Fields["cron"] = append(ve.Fields["cron"], "is invalid syntax: "+strings.TrimPrefix(err.Error(), cron.ErrSyntax.Error()+": "))
	}
	loc, lerr := loadZone(zone)
	if lerr != nil {
		ve.Fields["cron_timezone"] = append(ve.Fields["cron_timezone"], lerr.Error())
	}
	var next time.Time
	if err == nil && lerr == nil {
		if next = c.Next(t, loc); next.IsZero() {
			ve.Fields["cron"] = append(ve.Fields["cron"], fmt.Sprintf("%q never matches a day of the calendar", expr))
		}
	}
	if len(ve.Fields) > 0 {
		return time.Time{}, ve
	}
	return next.UTC(), nil
}

func loadZone(zone string) (*time.Location, error) {
	// "Local" is the coordinator's own zone, which moves with the host;
	// a path would read a file.
	if zone == "" || zone == "Local" || strings.Contains(zone, "..") || strings.HasPrefix(zone, "/") {
		return nil, fmt.Errorf("is not a time zone: %q (want an IANA name such as UTC or Europe/Berlin)", zone)
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, fmt.Errorf("is not a time zone: %q (want an IANA name such as UTC or Europe/Berlin)", zone)
	}
	return loc, nil
}

// validateSchedule checks the fields a schedule needs; it returns the
// next run after now.
func validateSchedule(ps *store.PipelineSchedule, now time.Time) (time.Time, error) {
	ve := &ValidationError{Fields: map[string][]string{}}
	if strings.TrimSpace(ps.Description) == "" {
		ve.Fields["description"] = []string{"can't be blank"}
	}
	if strings.TrimSpace(ps.Ref) == "" {
		ve.Fields["ref"] = []string{"can't be blank"}
	}
	for i, v := range ps.Variables {
		if !ValidVariableKey(v.Key) {
			ve.Fields["variables"] = append(ve.Fields["variables"], fmt.Sprintf("key %q: only letters, digits and _ are allowed", v.Key))
		}
		for _, w := range ps.Variables[:i] {
			if w.Key == v.Key {
				ve.Fields["variables"] = append(ve.Fields["variables"], fmt.Sprintf("key %q is given twice", v.Key))
			}
		}
	}
	for i, in := range ps.Inputs {
		if in.Name == "" {
			ve.Fields["inputs"] = append(ve.Fields["inputs"], "name can't be blank")
		}
		for _, w := range ps.Inputs[:i] {
			if w.Name == in.Name && in.Name != "" {
				ve.Fields["inputs"] = append(ve.Fields["inputs"], fmt.Sprintf("input %q is given twice", in.Name))
			}
		}
	}
	next, err := NextRun(ps.Cron, ps.CronTimezone, now)
	var te *ValidationError
	if errors.As(err, &te) {
		for k, v := range te.Fields {
			ve.Fields[k] = append(ve.Fields[k], v...)
		}
	}
	if len(ve.Fields) > 0 {
		return time.Time{}, ve
	}
	return next, nil
}

// CreateSchedule checks and stores a new schedule, setting its ID,
// times and next run. Errors: *ValidationError, ErrNotFound (project).
func (s *Engine) CreateSchedule(ctx context.Context, ps *store.PipelineSchedule) error {
	now := s.clock.Now().UTC()
	next, err := validateSchedule(ps, now)
	if err != nil {
		return err
	}
	ps.NextRunAt, ps.CreatedAt, ps.UpdatedAt = next, now, now
	if err := s.store.CreatePipelineSchedule(ctx, ps); errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("project %d: %w", ps.ProjectID, ErrNotFound)
	} else if err != nil {
		return err
	}
	s.log.Info("pipeline schedule created", "project_id", ps.ProjectID, "schedule_id", ps.ID, "cron", ps.Cron, "zone", ps.CronTimezone, "next_run_at", ps.NextRunAt)
	return nil
}

// UpdateSchedule applies change to schedule id of project projectID and
// stores it: the next run moves when the cron expression or the zone
// changes, or the schedule is activated (a paused schedule does not make
// up for the runs it missed). change runs again on the schedule as read
// anew if it was changed meanwhile. Errors: *ValidationError,
// ErrNotFound, and those of change.
func (s *Engine) UpdateSchedule(ctx context.Context, projectID, id int64, change func(*store.PipelineSchedule) error) (*store.PipelineSchedule, error) {
	for attempt := 0; ; attempt++ {
		ps, err := s.Schedule(ctx, projectID, id)
		if err != nil {
			return nil, err
		}
		before := *ps
		if err := change(ps); err != nil {
			return nil, err
		}
		now := s.clock.Now().UTC()
		next, err := validateSchedule(ps, now)
		if err != nil {
			return nil, err
		}
		if ps.Cron != before.Cron || ps.CronTimezone != before.CronTimezone || ps.Active && !before.Active {
			ps.NextRunAt = next
		}
		ps.UpdatedAt = now
		err = s.store.UpdatePipelineSchedule(ctx, ps)
		switch {
		case err == nil:
			return ps, nil
		case errors.Is(err, store.ErrNotFound):
			return nil, fmt.Errorf("pipeline schedule %d: %w", id, ErrNotFound)
		case errors.Is(err, store.ErrConflict) && attempt < 5:
			continue
		default:
			return nil, err
		}
	}
}

// Schedule returns schedule id if it belongs to project projectID;
// ErrNotFound otherwise.
func (s *Engine) Schedule(ctx context.Context, projectID, id int64) (*store.PipelineSchedule, error) {
	ps, err := s.store.GetPipelineSchedule(ctx, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && ps.ProjectID != projectID {
		return nil, fmt.Errorf("pipeline schedule %d: %w", id, ErrNotFound)
	}
	return ps, err
}

// PlaySchedule runs a schedule now, as Source schedule with its
// variables and inputs, leaving its next run where it is (GitLab's
// "play"). The caller checks the user's access.
func (s *Engine) PlaySchedule(ctx context.Context, ps *store.PipelineSchedule) (*store.Pipeline, error) {
	return s.runSchedule(ctx, ps)
}

// RunDueSchedules runs every active schedule due at now: it claims the
// run by moving NextRunAt past now, then creates the pipeline with the
// owner's access (a schedule whose owner is gone or may no longer run
// pipelines on its ref is deactivated, as GitLab does). A schedule whose
// pipeline cannot be created (no such ref, workflow rules) is logged and
// runs again at its next time; invalid configuration makes a failed
// pipeline that says why.
func (s *Engine) RunDueSchedules(ctx context.Context, now time.Time) error {
	due, err := s.store.DuePipelineSchedules(ctx, now, dueBatch)
	if err != nil {
		return err
	}
	var errs []error
	for _, ps := range due {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.runDue(ctx, ps, now); err != nil {
			errs = append(errs, fmt.Errorf("pipeline schedule %d: %w", ps.ID, err))
		}
	}
	return errors.Join(errs...)
}

func (s *Engine) runDue(ctx context.Context, ps *store.PipelineSchedule, now time.Time) error {
	next, err := NextRun(ps.Cron, ps.CronTimezone, now)
	if err != nil {
		// Stored before a check this binary makes (or a zone the host
		// lost, or no minute left to match): it cannot run, so it stops.
		s.log.Warn("pipeline schedule deactivated: its timing is invalid", "schedule_id", ps.ID, "err", err)
		ps.Active = false
		return s.claim(ctx, ps, now)
	}
	ps.NextRunAt = next
	if ok, why, err := s.OwnerMayRun(ctx, ps.OwnerID, ps.ProjectID, ps.Ref); err != nil {
		return err
	} else if !ok {
		s.log.Warn("pipeline schedule deactivated", "schedule_id", ps.ID, "project_id", ps.ProjectID, "why", why)
		ps.Active = false
	}
	if err := s.claim(ctx, ps, now); errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
		return nil // changed, run or deleted meanwhile: it is due again only if still so
	} else if err != nil {
		return err
	}
	if !ps.Active {
		return nil
	}
	// The run is claimed: it gets its own time, not what is left of the
	// reaper's round.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), scheduleRunTimeout)
	defer cancel()
	_, err = s.runSchedule(rctx, ps)
	var pe *PipelineError
	if errors.As(err, &pe) {
		return nil // logged
	}
	return err
}

func (s *Engine) claim(ctx context.Context, ps *store.PipelineSchedule, now time.Time) error {
	ps.UpdatedAt = now.UTC()
	return s.store.UpdatePipelineSchedule(ctx, ps)
}

// runSchedule creates the schedule's pipeline and records it as the
// schedule's.
func (s *Engine) runSchedule(ctx context.Context, ps *store.PipelineSchedule) (*store.Pipeline, error) {
	req := PipelineRequest{ProjectID: ps.ProjectID, Ref: ps.Ref, Source: SourceSchedule, StoreConfigErrors: true,
		scheduleDescription: ps.Description}
	for _, v := range ps.Variables {
		req.Variables = append(req.Variables, requestVariable(v))
	}
	if len(ps.Inputs) > 0 {
		req.Inputs = make(map[string]any, len(ps.Inputs))
		for _, in := range ps.Inputs {
			req.Inputs[in.Name] = in.Value
		}
	}
	pl, err := s.CreatePipeline(ctx, req)
	if err != nil {
		s.log.Warn("scheduled pipeline not created", "schedule_id", ps.ID, "project_id", ps.ProjectID, "ref", ps.Ref, "why", err)
		return nil, err
	}
	if err := s.store.AddSchedulePipeline(ctx, ps.ID, pl.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return pl, err
	}
	s.log.Info("scheduled pipeline created", "schedule_id", ps.ID, "project_id", ps.ProjectID, "pipeline_id", pl.ID, "status", pl.Status)
	return pl, nil
}
