package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

const (
	triggerCols      = `id, project_id, description, owner_id, token_digest, token_hint, created_at, updated_at, last_used, expires_at`
	sqlCreateTrigger = `INSERT INTO pipeline_triggers (project_id, description, owner_id, token_digest, token_hint, created_at, updated_at, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`
	sqlGetTrigger      = `SELECT ` + triggerCols + ` FROM pipeline_triggers WHERE id = ?`
	sqlTriggerByDigest = `SELECT ` + triggerCols + ` FROM pipeline_triggers WHERE token_digest = ?`
	sqlListTriggers    = `SELECT ` + triggerCols + ` FROM pipeline_triggers WHERE project_id = ? ORDER BY id`
	sqlUpdateTrigger   = `UPDATE pipeline_triggers SET description = ?, owner_id = ?, updated_at = ? WHERE id = ?`
	sqlTouchTrigger    = `UPDATE pipeline_triggers SET last_used = ? WHERE id = ?`
	sqlDeleteTrigger   = `DELETE FROM pipeline_triggers WHERE id = ?`
)

func scanTrigger(sc scanner) (*store.PipelineTrigger, error) {
	var (
		t                             store.PipelineTrigger
		created, updated, used, expir sql.NullInt64
	)
	if err := sc.Scan(&t.ID, &t.ProjectID, &t.Description, &t.OwnerID, &t.TokenDigest, &t.TokenHint, &created, &updated, &used, &expir); err != nil {
		return nil, err
	}
	t.CreatedAt, t.UpdatedAt, t.LastUsed, t.ExpiresAt = timeCol(created), timeCol(updated), timeCol(used), timeCol(expir)
	return &t, nil
}

// CreatePipelineTrigger inserts t.
func (s *Store) CreatePipelineTrigger(ctx context.Context, t *store.PipelineTrigger) error {
	if t == nil || t.TokenDigest == "" {
		return fmt.Errorf("creating pipeline trigger: %w", errInvalid)
	}
	var id int64
	err := s.write(ctx, func(tx *wtx) error {
		err := tx.queryRow(sqlCreateTrigger, t.ProjectID, t.Description, t.OwnerID, t.TokenDigest, t.TokenHint,
			timeArg(t.CreatedAt), timeArg(t.UpdatedAt), timeArg(t.ExpiresAt)).Scan(&id)
		switch {
		case s.isUnique(err):
			return store.ErrExists
		case s.isForeignKey(err):
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("creating pipeline trigger of project %d: %w", t.ProjectID, err)
	}
	t.ID = id
	return nil
}

// GetPipelineTrigger returns one trigger.
func (s *Store) GetPipelineTrigger(ctx context.Context, id int64) (*store.PipelineTrigger, error) {
	t, err := scanTrigger(s.queryRow(ctx, sqlGetTrigger, id))
	if err != nil {
		return nil, fmt.Errorf("getting pipeline trigger %d: %w", id, notFound(err))
	}
	return t, nil
}

// PipelineTriggerByDigest finds a trigger by its token's digest.
func (s *Store) PipelineTriggerByDigest(ctx context.Context, digest string) (*store.PipelineTrigger, error) {
	if digest == "" {
		return nil, fmt.Errorf("finding pipeline trigger: %w", store.ErrNotFound)
	}
	t, err := scanTrigger(s.queryRow(ctx, sqlTriggerByDigest, digest))
	if err != nil {
		return nil, fmt.Errorf("finding pipeline trigger: %w", notFound(err))
	}
	return t, nil
}

// ListPipelineTriggers returns a project's triggers ordered by ID.
func (s *Store) ListPipelineTriggers(ctx context.Context, projectID int64) ([]*store.PipelineTrigger, error) {
	rows, err := s.query(ctx, sqlListTriggers, projectID)
	if err != nil {
		return nil, fmt.Errorf("listing pipeline triggers: %w", err)
	}
	defer rows.Close()
	var out []*store.PipelineTrigger
	for rows.Next() {
		t, err := scanTrigger(rows)
		if err != nil {
			return nil, fmt.Errorf("listing pipeline triggers: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing pipeline triggers: %w", err)
	}
	return out, nil
}

// UpdatePipelineTrigger writes the description and owner.
func (s *Store) UpdatePipelineTrigger(ctx context.Context, t *store.PipelineTrigger) error {
	if t == nil {
		return fmt.Errorf("updating pipeline trigger: %w", errInvalid)
	}
	return s.execOne(ctx, fmt.Sprintf("updating pipeline trigger %d", t.ID), sqlUpdateTrigger, t.Description, t.OwnerID, timeArg(t.UpdatedAt), t.ID)
}

// TouchPipelineTrigger sets when a trigger was last used.
func (s *Store) TouchPipelineTrigger(ctx context.Context, id int64, at time.Time) error {
	return s.execOne(ctx, fmt.Sprintf("recording the use of pipeline trigger %d", id), sqlTouchTrigger, timeArg(at), id)
}

// DeletePipelineTrigger removes a trigger.
func (s *Store) DeletePipelineTrigger(ctx context.Context, id int64) error {
	return s.execOne(ctx, fmt.Sprintf("deleting pipeline trigger %d", id), sqlDeleteTrigger, id)
}

// execOne runs a write that must change one row: ErrNotFound otherwise.
func (s *Store) execOne(ctx context.Context, what, q string, args ...any) error {
	err := s.write(ctx, func(tx *wtx) error {
		n, err := tx.exec(q, args...)
		if err == nil && n == 0 {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}
