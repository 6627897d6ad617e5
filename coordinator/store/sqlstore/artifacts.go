package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// PutArtifact records a, replacing the job's artifact of the same type,
// sets a.ID and returns the replaced artifact, if any.
func (s *Store) PutArtifact(ctx context.Context, a *store.Artifact) (*store.Artifact, error) {
	if a == nil {
		return nil, fmt.Errorf("putting artifact: %w", errInvalid)
	}
	var (
		id       int64
		replaced *store.Artifact
	)
	err := s.write(ctx, func(tx *wtx) error {
		replaced = nil
		old, err := scanArtifact(tx.queryRow(sqlArtifactByType, a.JobID, a.Type))
		switch {
		case err == nil:
			if _, err := tx.exec(sqlDeleteArtifact, old.ID); err != nil {
				return err
			}
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		err = tx.queryRow(sqlInsertArtifact, a.JobID, a.Type, a.Format, a.Filename, a.Size, a.StorageKey,
			timeArg(a.ExpireAt), timeArg(a.CreatedAt)).Scan(&id)
		if s.isForeignKey(err) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
		}
		replaced = old
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("putting %s artifact of job %d: %w", a.Type, a.JobID, err)
	}
	a.ID = id
	return replaced, nil
}

// ListArtifacts returns a job's artifacts ordered by ID.
func (s *Store) ListArtifacts(ctx context.Context, jobID int64) ([]*store.Artifact, error) {
	out, err := s.listArtifacts(ctx, sqlListArtifacts, jobID)
	if err != nil {
		return nil, fmt.Errorf("listing artifacts of job %d: %w", jobID, err)
	}
	return out, nil
}

// ArtifactsOfType returns every job's artifacts of type typ ordered by
// ID.
func (s *Store) ArtifactsOfType(ctx context.Context, typ string) ([]*store.Artifact, error) {
	out, err := s.listArtifacts(ctx, sqlArtifactsOfType, typ)
	if err != nil {
		return nil, fmt.Errorf("listing %s artifacts: %w", typ, err)
	}
	return out, nil
}

// ExpiredArtifacts lists artifacts expiring before t, soonest first; a
// limit of 0 or less means no limit.
func (s *Store) ExpiredArtifacts(ctx context.Context, before time.Time, limit int) ([]*store.Artifact, error) {
	lim := int64(limit)
	if lim <= 0 {
		lim = math.MaxInt64
	}
	out, err := s.listArtifacts(ctx, sqlExpiredArtifacts, before.UnixMicro(), lim)
	if err != nil {
		return nil, fmt.Errorf("listing expired artifacts: %w", err)
	}
	return out, nil
}

func (s *Store) listArtifacts(ctx context.Context, query string, args ...any) ([]*store.Artifact, error) {
	rows, err := s.query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*store.Artifact
	for rows.Next() {
		a, err := scanArtifact(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// DeleteArtifact removes one artifact record.
func (s *Store) DeleteArtifact(ctx context.Context, id int64) error {
	err := s.write(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlDeleteArtifact, id)
		if err == nil && n == 0 {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("deleting artifact %d: %w", id, err)
	}
	return nil
}
