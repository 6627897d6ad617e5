package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// errStatus is wrapped into errors about an unknown or misplaced status.
var errStatus = errors.New("invalid job status")

// knownStatus reports whether st is one of the store's statuses.
func knownStatus(st store.Status) bool { return st.Valid() }

// createJobArgs checks j and returns its insert arguments.
func createJobArgs(j *store.Job) ([]any, store.Status, error) {
	if j == nil {
		return nil, "", errInvalid
	}
	st := j.Status
	if st == "" {
		st = store.StatusPending
	}
	if !st.Creatable() {
		return nil, "", fmt.Errorf("status %q: %w", j.Status, errStatus)
	}
	tags, err := stringsArg(j.Tags)
	if err != nil {
		return nil, "", err
	}
	return []any{string(st), j.ProjectID, j.NamespaceID, idsArg(j.NamespaceIDs), j.PipelineID, j.Name, j.Stage, j.Ref,
		j.Protected, tags, int64(j.Priority), int64(j.Timeout), blobArg(slices.Clone(j.Spec)), idsArg(j.Dependencies),
		nullString(j.TokenDigest), j.RunnerID, j.RunnerManagerID, j.FailureReason, int64(j.ExitCode),
		blobArg(slices.Clone(j.Graph)), j.Retried, timeArg(j.ScheduledAt), timeArg(j.QueuedAt),
		timeArg(j.CreatedAt), timeArg(j.AssignedAt), timeArg(j.StartedAt), timeArg(j.FinishedAt), timeArg(j.UpdatedAt),
		j.Isolation}, st, nil
}

// CreateJob inserts j, which must be in a creatable status (an empty
// status means pending), and sets j.ID.
func (s *Store) CreateJob(ctx context.Context, j *store.Job) error {
	args, st, err := createJobArgs(j)
	if err != nil {
		return fmt.Errorf("creating job: %w", err)
	}
	var id int64
	err = s.writeRow(ctx, func(tx *wtx) error {
		var err error
		id, err = tx.insert(sqlCreateJob, args...)
		return err
	})
	if err != nil {
		return fmt.Errorf("creating job: %w", err)
	}
	j.ID, j.Status = id, st
	return nil
}

// CreateJobs inserts jobs in one transaction and sets their IDs.
func (s *Store) CreateJobs(ctx context.Context, jobs []*store.Job) error {
	all := make([][]any, len(jobs))
	sts := make([]store.Status, len(jobs))
	for i, j := range jobs {
		args, st, err := createJobArgs(j)
		if err != nil {
			return fmt.Errorf("creating job %d of %d: %w", i+1, len(jobs), err)
		}
		all[i], sts[i] = args, st
	}
	ids := make([]int64, len(jobs))
	err := s.writeRow(ctx, func(tx *wtx) error {
		for i, args := range all {
			id, err := tx.insert(sqlCreateJob, args...)
			if err != nil {
				return err
			}
			ids[i] = id
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("creating %d jobs: %w", len(jobs), err)
	}
	for i, j := range jobs {
		j.ID, j.Status = ids[i], sts[i]
	}
	return nil
}

// RetryJob marks oldID retried and inserts its replacement j.
func (s *Store) RetryJob(ctx context.Context, oldID int64, j *store.Job) error {
	args, st, err := createJobArgs(j)
	if err != nil {
		return fmt.Errorf("retrying job %d: %w", oldID, err)
	}
	var id int64
	err = s.write(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlMarkRetried, oldID)
		if err != nil {
			return err
		}
		if n == 0 {
			return missingOr(tx, sqlJobExists, oldID, store.ErrConflict)
		}
		id, err = tx.insert(sqlCreateJob, args...)
		return err
	})
	if err != nil {
		return fmt.Errorf("retrying job %d: %w", oldID, err)
	}
	j.ID, j.Status = id, st
	return nil
}

// GetJob returns the job id.
func (s *Store) GetJob(ctx context.Context, id int64) (*store.Job, error) {
	j, err := scanJob(s.queryRow(ctx, sqlGetJob, id))
	if err != nil {
		return nil, fmt.Errorf("getting job %d: %w", id, notFound(err))
	}
	return j, nil
}

// JobByTokenDigest returns the job whose current assignment has this token
// digest.
func (s *Store) JobByTokenDigest(ctx context.Context, digest string) (*store.Job, error) {
	j, err := scanJob(s.queryRow(ctx, sqlJobByTokenDigest, digest))
	if err != nil {
		return nil, fmt.Errorf("getting job by token: %w", notFound(err))
	}
	return j, nil
}

// ListJobs returns the jobs matching f ordered by ID.
func (s *Store) ListJobs(ctx context.Context, f store.JobFilter) ([]*store.Job, error) {
	q, args := listJobsQuery(f)
	rows, err := s.query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing jobs: %w", err)
	}
	defer rows.Close()
	var out []*store.Job
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			return nil, fmt.Errorf("listing jobs: %w", err)
		}
		out = append(out, j)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing jobs: %w", err)
	}
	return out, nil
}

// AssignJob hands a pending, unassigned job to a manager.
func (s *Store) AssignJob(ctx context.Context, a store.Assignment) error {
	if a.ManagerID == 0 {
		// Manager 0 means "not handed out": such an assignment could be
		// handed out again.
		return fmt.Errorf("assigning job %d: manager id 0: %w", a.JobID, errInvalid)
	}
	at := timeArg(a.At)
	query := sqlAssignJob
	if s.d == PostgreSQL {
		query = sqlAssignJobSkipLocked
	}
	err := s.writeRow(ctx, func(tx *wtx) error {
		n, err := tx.exec(query, a.RunnerID, a.ManagerID, nullString(a.TokenDigest), at, at, a.JobID)
		switch {
		case err != nil:
			return err
		case n == 1:
			return nil
		case query == sqlAssignJob:
			return missingOr(tx, sqlJobExists, a.JobID, store.ErrConflict)
		}
		// SKIP LOCKED matched nothing: the job is gone, taken, or held
		// by another transaction in flight. A job still queued as last
		// committed is the last case: the holder may yet roll back (or
		// die), and then nobody else would try it again.
		var exists, queued int
		if err := tx.queryRow(sqlJobQueued, a.JobID).Scan(&exists, &queued); err != nil {
			return err
		}
		switch {
		case exists == 0:
			return store.ErrNotFound
		case queued == 1:
			return store.ErrBusy
		}
		return store.ErrConflict
	})
	if err != nil {
		return fmt.Errorf("assigning job %d to manager %d: %w", a.JobID, a.ManagerID, err)
	}
	return nil
}

// UnassignJob returns a pending job assigned to managerID to the queue.
func (s *Store) UnassignJob(ctx context.Context, jobID, managerID int64) error {
	err := s.writeRow(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlUnassignJob, jobID, managerID)
		if err == nil && n == 0 {
			return store.ErrConflict
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("unassigning job %d from manager %d: %w", jobID, managerID, err)
	}
	return nil
}

// TransitionJob applies u if the job's status is one of from.
func (s *Store) TransitionJob(ctx context.Context, id int64, from []store.Status, u store.JobUpdate) (*store.Job, error) {
	if !knownStatus(u.Status) {
		return nil, fmt.Errorf("transitioning job %d to %q: %w", id, u.Status, errStatus)
	}
	// Only the fields the update sets are written; unknown statuses in
	// from match no job and are dropped.
	var set transitionSet
	args := make([]any, 0, 16)
	args = append(args, string(u.Status))
	for i, v := range []any{nullString(u.FailureReason), nullInt(u.ExitCode), timeArg(u.StartedAt), timeArg(u.FinishedAt),
		timeArg(u.UpdatedAt), timeArg(u.ScheduledAt), timeArg(u.QueuedAt)} {
		if v != nil {
			set |= 1 << i
			args = append(args, v)
		}
	}
	if u.Dependencies != nil {
		set |= 1 << 7
		args = append(args, idsArg(u.Dependencies))
	}
	if v := timeArg(u.ErasedAt); v != nil {
		set |= 1 << 8
		args = append(args, v)
	}
	if a := u.Assign; a != nil {
		if a.ManagerID == 0 {
			return nil, fmt.Errorf("transitioning job %d: assigning to manager id 0: %w", id, errInvalid)
		}
		set |= transitionAssign
		args = append(args, a.RunnerID, a.ManagerID, nullString(a.TokenDigest), timeArg(a.At))
	}
	args = append(args, id)
	if u.IfTokenDigest != "" {
		set |= transitionIfDigest
		args = append(args, u.IfTokenDigest)
	}
	var statuses []store.Status
	for _, st := range from {
		if knownStatus(st) && !slices.Contains(statuses, st) {
			statuses = append(statuses, st)
		}
	}
	for _, st := range statuses {
		args = append(args, string(st))
	}
	if len(statuses) == 0 {
		args = append(args, "") // matches no job
	}
	query := transitionJobQuery(set, len(statuses))
	var row jobRow
	err := s.writeRow(ctx, func(tx *wtx) error {
		err := row.scan(tx.queryRow(query, args...))
		if errors.Is(err, sql.ErrNoRows) {
			return missingOr(tx, sqlJobExists, id, store.ErrConflict)
		}
		return err
	})
	if err == nil {
		var j *store.Job
		if j, err = row.job(); err == nil {
			return j, nil
		}
	}
	return nil, fmt.Errorf("transitioning job %d to %s: %w", id, u.Status, err)
}

// MarkDebugTrace records that a job's log is a debug trace.
func (s *Store) MarkDebugTrace(ctx context.Context, id int64) error {
	err := s.writeRow(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlMarkDebugTrace, id)
		if err != nil || n == 1 {
			return err
		}
		return missingOr(tx, sqlJobExists, id, nil)
	})
	if err != nil {
		return fmt.Errorf("marking job %d's log a debug trace: %w", id, err)
	}
	return nil
}

// TouchJob records a sign of life of an unfinished job.
func (s *Store) TouchJob(ctx context.Context, id int64, at time.Time) error {
	err := s.writeRow(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlTouchJob, timeArg(at), id)
		switch {
		case err != nil:
			return err
		case n == 1:
			return nil
		}
		return missingOr(tx, sqlJobExists, id, store.ErrConflict)
	})
	if err != nil {
		return fmt.Errorf("touching job %d: %w", id, err)
	}
	return nil
}
