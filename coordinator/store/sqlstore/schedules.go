package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

const (
	scheduleCols = `id, project_id, description, ref, cron, cron_timezone, active, next_run_at, owner_id, variables, inputs,
created_at, updated_at, version,
(SELECT MAX(pipeline_id) FROM pipeline_schedule_pipelines WHERE schedule_id = pipeline_schedules.id)`
	sqlCreateSchedule = `INSERT INTO pipeline_schedules (project_id, description, ref, cron, cron_timezone, active, next_run_at,
owner_id, variables, inputs, created_at, updated_at, version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1) RETURNING id`
	sqlGetSchedule    = `SELECT ` + scheduleCols + ` FROM pipeline_schedules WHERE id = ?`
	sqlListSchedules  = `SELECT ` + scheduleCols + ` FROM pipeline_schedules WHERE project_id = ? ORDER BY id`
	sqlUpdateSchedule = `UPDATE pipeline_schedules SET description = ?, ref = ?, cron = ?, cron_timezone = ?, active = ?,
next_run_at = ?, owner_id = ?, variables = ?, inputs = ?, updated_at = ?, version = version + 1
WHERE id = ? AND version = ?`
	sqlScheduleVersion = `SELECT version FROM pipeline_schedules WHERE id = ?`
	sqlDeleteSchedule  = `DELETE FROM pipeline_schedules WHERE id = ?`
	sqlDueSchedules    = `SELECT ` + scheduleCols + ` FROM pipeline_schedules
WHERE active = ? AND next_run_at IS NOT NULL AND next_run_at <= ? ORDER BY next_run_at, id LIMIT ?`
	sqlAddSchedulePipeline = `INSERT INTO pipeline_schedule_pipelines (schedule_id, pipeline_id) VALUES (?, ?)
ON CONFLICT (schedule_id, pipeline_id) DO NOTHING`
)

func scanSchedule(sc scanner) (*store.PipelineSchedule, error) {
	var (
		s                     store.PipelineSchedule
		next, created, update sql.NullInt64
		last                  sql.NullInt64
		vars, inputs          sql.NullString
	)
	if err := sc.Scan(&s.ID, &s.ProjectID, &s.Description, &s.Ref, &s.Cron, &s.CronTimezone, &s.Active, &next,
		&s.OwnerID, &vars, &inputs, &created, &update, &s.Version, &last); err != nil {
		return nil, err
	}
	if vars.Valid && vars.String != "" {
		if err := json.Unmarshal([]byte(vars.String), &s.Variables); err != nil {
			return nil, fmt.Errorf("decoding schedule variables: %w", err)
		}
	}
	if inputs.Valid && inputs.String != "" {
		if err := json.Unmarshal([]byte(inputs.String), &s.Inputs); err != nil {
			return nil, fmt.Errorf("decoding schedule inputs: %w", err)
		}
	}
	s.NextRunAt, s.CreatedAt, s.UpdatedAt = timeCol(next), timeCol(created), timeCol(update)
	s.LastPipelineID = last.Int64
	return &s, nil
}

// scheduleArgs encodes the lists of s.
func scheduleArgs(s *store.PipelineSchedule) (vars, inputs any, err error) {
	if vars, err = pipelineVarsArg(s.Variables); err != nil {
		return nil, nil, err
	}
	if len(s.Inputs) > 0 {
		b, err := json.Marshal(s.Inputs)
		if err != nil {
			return nil, nil, err
		}
		inputs = string(b)
	}
	return vars, inputs, nil
}

// CreatePipelineSchedule inserts s.
func (s *Store) CreatePipelineSchedule(ctx context.Context, ps *store.PipelineSchedule) error {
	if ps == nil {
		return fmt.Errorf("creating pipeline schedule: %w", errInvalid)
	}
	vars, inputs, err := scheduleArgs(ps)
	if err != nil {
		return fmt.Errorf("creating pipeline schedule: %w", err)
	}
	var id int64
	err = s.write(ctx, func(tx *wtx) error {
		err := tx.queryRow(sqlCreateSchedule, ps.ProjectID, ps.Description, ps.Ref, ps.Cron, ps.CronTimezone, ps.Active,
			timeArg(ps.NextRunAt), ps.OwnerID, vars, inputs, timeArg(ps.CreatedAt), timeArg(ps.UpdatedAt)).Scan(&id)
		if s.isForeignKey(err) {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("creating pipeline schedule of project %d: %w", ps.ProjectID, err)
	}
	ps.ID, ps.Version = id, 1
	return nil
}

// GetPipelineSchedule returns one schedule.
func (s *Store) GetPipelineSchedule(ctx context.Context, id int64) (*store.PipelineSchedule, error) {
	ps, err := scanSchedule(s.queryRow(ctx, sqlGetSchedule, id))
	if err != nil {
		return nil, fmt.Errorf("getting pipeline schedule %d: %w", id, notFound(err))
	}
	return ps, nil
}

// ListPipelineSchedules returns a project's schedules ordered by ID.
func (s *Store) ListPipelineSchedules(ctx context.Context, projectID int64) ([]*store.PipelineSchedule, error) {
	return s.listSchedules(ctx, "listing pipeline schedules", sqlListSchedules, projectID)
}

// DuePipelineSchedules lists active schedules due at t, soonest first.
func (s *Store) DuePipelineSchedules(ctx context.Context, t time.Time, limit int) ([]*store.PipelineSchedule, error) {
	if limit <= 0 {
		return nil, nil
	}
	return s.listSchedules(ctx, "listing due pipeline schedules", sqlDueSchedules, true, t.UnixMicro(), limit)
}

func (s *Store) listSchedules(ctx context.Context, what, q string, args ...any) ([]*store.PipelineSchedule, error) {
	rows, err := s.query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	var out []*store.PipelineSchedule
	for rows.Next() {
		ps, err := scanSchedule(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, ps)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// UpdatePipelineSchedule writes s if it is still at s.Version.
func (s *Store) UpdatePipelineSchedule(ctx context.Context, ps *store.PipelineSchedule) error {
	if ps == nil {
		return fmt.Errorf("updating pipeline schedule: %w", errInvalid)
	}
	vars, inputs, err := scheduleArgs(ps)
	if err != nil {
		return fmt.Errorf("updating pipeline schedule %d: %w", ps.ID, err)
	}
	err = s.write(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlUpdateSchedule, ps.Description, ps.Ref, ps.Cron, ps.CronTimezone, ps.Active,
			timeArg(ps.NextRunAt), ps.OwnerID, vars, inputs, timeArg(ps.UpdatedAt), ps.ID, ps.Version)
		if err != nil || n == 1 {
			return err
		}
		var v int64
		if err := tx.queryRow(sqlScheduleVersion, ps.ID).Scan(&v); errors.Is(err, sql.ErrNoRows) {
			return store.ErrNotFound
		} else if err != nil {
			return err
		}
		return store.ErrConflict
	})
	if err != nil {
		return fmt.Errorf("updating pipeline schedule %d: %w", ps.ID, err)
	}
	ps.Version++
	return nil
}

// DeletePipelineSchedule removes a schedule.
func (s *Store) DeletePipelineSchedule(ctx context.Context, id int64) error {
	return s.execOne(ctx, fmt.Sprintf("deleting pipeline schedule %d", id), sqlDeleteSchedule, id)
}

// AddSchedulePipeline links a pipeline to the schedule that created it.
func (s *Store) AddSchedulePipeline(ctx context.Context, scheduleID, pipelineID int64) error {
	err := s.write(ctx, func(tx *wtx) error {
		_, err := tx.exec(sqlAddSchedulePipeline, scheduleID, pipelineID)
		if s.isForeignKey(err) {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("recording pipeline %d of schedule %d: %w", pipelineID, scheduleID, err)
	}
	return nil
}
