package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// errInvalid is wrapped into the error of a call given a nil pointer or
// an impossible value.
var errInvalid = errors.New("invalid argument")

// GetSetting returns the value of key; store.ErrNotFound if unset.
func (s *Store) GetSetting(ctx context.Context, key string) (string, error) {
	var v string
	if err := s.queryRow(ctx, sqlGetSetting, key).Scan(&v); err != nil {
		return "", fmt.Errorf("getting setting %q: %w", key, notFound(err))
	}
	return v, nil
}

// PutSetting sets key to value.
func (s *Store) PutSetting(ctx context.Context, key, value string) error {
	err := s.writeRow(ctx, func(tx *wtx) error {
		_, err := tx.exec(sqlPutSetting, key, value)
		return err
	})
	if err != nil {
		return fmt.Errorf("putting setting %q: %w", key, err)
	}
	return nil
}

// PutRegistrationToken stores t, replacing the token of its scope.
func (s *Store) PutRegistrationToken(ctx context.Context, t store.RegistrationToken) error {
	err := s.write(ctx, func(tx *wtx) error {
		_, err := tx.exec(sqlPutRegistrationToken, string(t.Scope), t.ScopeID, t.Digest, timeArg(t.CreatedAt))
		if s.isUnique(err) {
			return store.ErrExists
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("putting registration token of %s %d: %w", t.Scope, t.ScopeID, err)
	}
	return nil
}

// RegistrationTokenByDigest finds a registration token.
func (s *Store) RegistrationTokenByDigest(ctx context.Context, digest string) (*store.RegistrationToken, error) {
	var (
		t       store.RegistrationToken
		scope   string
		created sql.NullInt64
	)
	err := s.queryRow(ctx, sqlRegistrationTokenByDigest, digest).Scan(&t.Digest, &scope, &t.ScopeID, &created)
	if err != nil {
		return nil, fmt.Errorf("getting registration token: %w", notFound(err))
	}
	t.Scope, t.CreatedAt = store.RunnerType(scope), timeCol(created)
	return &t, nil
}

// runnerArgs are the settable columns of r, in sqlUpdateRunner order
// (without contacted_at and id).
func runnerArgs(r *store.Runner) ([]any, error) {
	tags, err := stringsArg(r.Tags)
	if err != nil {
		return nil, err
	}
	return []any{string(r.Type), r.GroupID, idsArg(r.ProjectIDs), r.Description, r.MaintenanceNote, tags,
		r.RunUntagged, r.Locked, r.Paused, string(r.AccessLevel), int64(r.MaximumTimeout), r.Legacy}, nil
}

// CreateRunner inserts r and sets r.ID; store.ErrExists if its token
// digest is taken.
func (s *Store) CreateRunner(ctx context.Context, r *store.Runner) error {
	if r == nil {
		return fmt.Errorf("creating runner: %w", errInvalid)
	}
	args, err := runnerArgs(r)
	if err != nil {
		return fmt.Errorf("creating runner: %w", err)
	}
	args = append(args, nullString(r.TokenDigest), timeArg(r.TokenObtainedAt), timeArg(r.TokenExpiresAt),
		timeArg(r.CreatedAt), timeArg(r.ContactedAt))
	var id int64
	err = s.write(ctx, func(tx *wtx) error {
		err := tx.queryRow(sqlCreateRunner, args...).Scan(&id)
		if s.isUnique(err) {
			return store.ErrExists
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("creating runner: %w", err)
	}
	r.ID = id
	return nil
}

// GetRunner returns the runner id.
func (s *Store) GetRunner(ctx context.Context, id int64) (*store.Runner, error) {
	r, err := scanRunner(s.queryRow(ctx, sqlGetRunner, id))
	if err != nil {
		return nil, fmt.Errorf("getting runner %d: %w", id, notFound(err))
	}
	return r, nil
}

// RunnerByTokenDigest returns the runner with this token digest.
func (s *Store) RunnerByTokenDigest(ctx context.Context, digest string) (*store.Runner, error) {
	r, err := scanRunner(s.queryRow(ctx, sqlRunnerByTokenDigest, digest))
	if err != nil {
		return nil, fmt.Errorf("getting runner by token: %w", notFound(err))
	}
	return r, nil
}

// ListRunners returns all runners ordered by ID.
func (s *Store) ListRunners(ctx context.Context) ([]*store.Runner, error) {
	rows, err := s.query(ctx, sqlListRunners)
	if err != nil {
		return nil, fmt.Errorf("listing runners: %w", err)
	}
	defer rows.Close()
	var out []*store.Runner
	for rows.Next() {
		r, err := scanRunner(rows)
		if err != nil {
			return nil, fmt.Errorf("listing runners: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing runners: %w", err)
	}
	return out, nil
}

// UpdateRunner writes the settable fields of r.
func (s *Store) UpdateRunner(ctx context.Context, r *store.Runner) error {
	if r == nil {
		return fmt.Errorf("updating runner: %w", errInvalid)
	}
	args, err := runnerArgs(r)
	if err != nil {
		return fmt.Errorf("updating runner %d: %w", r.ID, err)
	}
	args = append(args, timeArg(r.ContactedAt), r.ID)
	err = s.writeRow(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlUpdateRunner, args...)
		if err == nil && n == 0 {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("updating runner %d: %w", r.ID, err)
	}
	return nil
}

// RotateRunnerToken replaces the token digest if it is still oldDigest.
func (s *Store) RotateRunnerToken(ctx context.Context, id int64, oldDigest, newDigest string, obtainedAt, expiresAt time.Time) error {
	err := s.writeRow(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlRotateRunnerToken, nullString(newDigest), timeArg(obtainedAt), timeArg(expiresAt), id, oldDigest)
		switch {
		case s.isUnique(err):
			return store.ErrExists
		case err != nil:
			return err
		case n == 1:
			return nil
		}
		return missingOr(tx, sqlRunnerExists, id, store.ErrConflict)
	})
	if err != nil {
		return fmt.Errorf("rotating token of runner %d: %w", id, err)
	}
	return nil
}

// missingOr tells why a conditional write matched no row: ErrNotFound if
// the row does not exist, else otherwise.
func missingOr(tx *wtx, existsQuery string, id int64, otherwise error) error {
	var n int
	if err := tx.queryRow(existsQuery, id).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return otherwise
}

// DeleteRunner removes a runner and (by cascade) its managers.
func (s *Store) DeleteRunner(ctx context.Context, id int64) error {
	err := s.write(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlDeleteRunner, id)
		if err == nil && n == 0 {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("deleting runner %d: %w", id, err)
	}
	return nil
}

// UpsertRunnerManager creates or updates the manager (RunnerID, SystemID)
// and sets m.ID and m.CreatedAt.
func (s *Store) UpsertRunnerManager(ctx context.Context, m *store.RunnerManager) error {
	if m == nil {
		return fmt.Errorf("upserting runner manager: %w", errInvalid)
	}
	created := m.CreatedAt
	if created.IsZero() {
		created = m.ContactedAt
	}
	var (
		id         int64
		createdCol sql.NullInt64
	)
	err := s.writeRow(ctx, func(tx *wtx) error {
		err := tx.queryRow(sqlUpsertRunnerMgr, m.RunnerID, m.SystemID, blobArg(m.Info), timeArg(created), timeArg(m.ContactedAt)).
			Scan(&id, &createdCol)
		if s.isForeignKey(err) {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("upserting manager %q of runner %d: %w", m.SystemID, m.RunnerID, err)
	}
	m.ID, m.CreatedAt = id, timeCol(createdCol)
	return nil
}

// ListRunnerManagers returns a runner's managers ordered by ID (runnerID
// 0: every runner's).
func (s *Store) ListRunnerManagers(ctx context.Context, runnerID int64) ([]*store.RunnerManager, error) {
	var (
		rows *sql.Rows
		err  error
	)
	if runnerID == 0 {
		rows, err = s.query(ctx, sqlListAllRunnerManagers)
	} else {
		rows, err = s.query(ctx, sqlListRunnerManagers, runnerID)
	}
	if err != nil {
		return nil, fmt.Errorf("listing managers of runner %d: %w", runnerID, err)
	}
	defer rows.Close()
	var out []*store.RunnerManager
	for rows.Next() {
		m, err := scanManager(rows)
		if err != nil {
			return nil, fmt.Errorf("listing managers of runner %d: %w", runnerID, err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing managers of runner %d: %w", runnerID, err)
	}
	return out, nil
}

// PutRunnerManagerFleet records a manager's fleet report.
func (s *Store) PutRunnerManagerFleet(ctx context.Context, runnerID int64, systemID string, fleet []byte, at time.Time) error {
	err := s.writeRow(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlPutRunnerMgrFleet, blobArg(fleet), timeArg(at), runnerID, systemID)
		if err == nil && n == 0 {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("putting fleet report of manager %q of runner %d: %w", systemID, runnerID, err)
	}
	return nil
}

// DeleteRunnerManager removes one manager.
func (s *Store) DeleteRunnerManager(ctx context.Context, runnerID int64, systemID string) error {
	err := s.write(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlDeleteRunnerMgr, runnerID, systemID)
		if err == nil && n == 0 {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("deleting manager %q of runner %d: %w", systemID, runnerID, err)
	}
	return nil
}
