package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// Environments, deployments, releases and Pages deployments.
const (
	environmentCols        = `id, project_id, name, slug, external_url, tier, state, auto_stop_at, created_at, updated_at`
	sqlEnvironmentByName   = `SELECT ` + environmentCols + ` FROM environments WHERE project_id = ? AND name = ?`
	sqlGetEnvironment      = `SELECT ` + environmentCols + ` FROM environments WHERE id = ?`
	sqlListEnvironments    = `SELECT ` + environmentCols + ` FROM environments WHERE project_id = ? ORDER BY id`
	sqlDueEnvironments     = `SELECT ` + environmentCols + ` FROM environments WHERE state = 'available' AND auto_stop_at IS NOT NULL AND auto_stop_at < ? ORDER BY auto_stop_at, id LIMIT ?`
	sqlCreateEnvironment   = `INSERT INTO environments (project_id, name, slug, external_url, tier, state, auto_stop_at, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`
	sqlUpdateEnvironment   = `UPDATE environments SET external_url = ?, tier = ?, state = ?, auto_stop_at = ?, updated_at = ? WHERE id = ?`
	deploymentCols         = `id, iid, project_id, environment_id, job_id, pipeline_id, ref, tag, sha, status, on_stop, auto_stop_in, created_at, updated_at, finished_at`
	sqlNextDeploymentIID   = `SELECT COALESCE(MAX(iid), 0) + 1 FROM deployments WHERE project_id = ?`
	sqlCreateDeployment    = `INSERT INTO deployments (iid, project_id, environment_id, job_id, pipeline_id, ref, tag, sha, status, on_stop, auto_stop_in, created_at, updated_at, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	sqlDeploymentOfJob     = `SELECT COUNT(*) FROM deployments WHERE job_id = ?`
	sqlUpdateDeployment    = `UPDATE deployments SET status = ?, updated_at = ?, finished_at = COALESCE(?, finished_at) WHERE id = ?`
	sqlGetDeployment       = `SELECT ` + deploymentCols + ` FROM deployments WHERE id = ?`
	releaseCols            = `id, project_id, tag_name, name, description, sha, milestones, links, job_id, released_at, created_at`
	sqlCreateRelease       = `INSERT INTO releases (project_id, tag_name, name, description, sha, milestones, links, job_id, released_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	sqlGetRelease          = `SELECT ` + releaseCols + ` FROM releases WHERE project_id = ? AND tag_name = ?`
	sqlListReleases        = `SELECT ` + releaseCols + ` FROM releases WHERE project_id = ? ORDER BY released_at DESC, id DESC`
	pagesCols              = `id, project_id, job_id, path_prefix, dir, size, file_count, expire_at, created_at`
	sqlPagesByPrefix       = `SELECT ` + pagesCols + ` FROM pages_deployments WHERE project_id = ? AND path_prefix = ?`
	sqlInsertPages         = `INSERT INTO pages_deployments (project_id, job_id, path_prefix, dir, size, file_count, expire_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`
	sqlDeletePages         = `DELETE FROM pages_deployments WHERE id = ?`
	sqlListPages           = `SELECT ` + pagesCols + ` FROM pages_deployments WHERE project_id = ? ORDER BY id`
	sqlExpiredPages        = `SELECT ` + pagesCols + ` FROM pages_deployments WHERE expire_at IS NOT NULL AND expire_at < ? ORDER BY expire_at, id LIMIT ?`
	sqlListDeploymentsBase = `SELECT ` + deploymentCols + ` FROM deployments`
)

func scanEnvironment(sc scanner) (*store.Environment, error) {
	var (
		e                      store.Environment
		stop, created, updated sql.NullInt64
	)
	if err := sc.Scan(&e.ID, &e.ProjectID, &e.Name, &e.Slug, &e.ExternalURL, &e.Tier, &e.State, &stop, &created, &updated); err != nil {
		return nil, err
	}
	e.AutoStopAt, e.CreatedAt, e.UpdatedAt = timeCol(stop), timeCol(created), timeCol(updated)
	return &e, nil
}

func scanDeployment(sc scanner) (*store.Deployment, error) {
	var (
		d                          store.Deployment
		created, updated, finished sql.NullInt64
	)
	if err := sc.Scan(&d.ID, &d.IID, &d.ProjectID, &d.EnvironmentID, &d.JobID, &d.PipelineID, &d.Ref, &d.Tag, &d.Sha,
		&d.Status, &d.OnStop, &d.AutoStopIn, &created, &updated, &finished); err != nil {
		return nil, err
	}
	d.CreatedAt, d.UpdatedAt, d.FinishedAt = timeCol(created), timeCol(updated), timeCol(finished)
	return &d, nil
}

func scanRelease(sc scanner) (*store.Release, error) {
	var (
		r                 store.Release
		milestones, links sql.NullString
		released, created sql.NullInt64
	)
	if err := sc.Scan(&r.ID, &r.ProjectID, &r.TagName, &r.Name, &r.Description, &r.Sha, &milestones, &links, &r.JobID, &released, &created); err != nil {
		return nil, err
	}
	var err error
	if r.Milestones, err = stringsCol(milestones); err != nil {
		return nil, err
	}
	if links.Valid && links.String != "" {
		if err := json.Unmarshal([]byte(links.String), &r.Links); err != nil {
			return nil, fmt.Errorf("decoding release links: %w", err)
		}
	}
	r.ReleasedAt, r.CreatedAt = timeCol(released), timeCol(created)
	return &r, nil
}

func scanPages(sc scanner) (*store.PagesDeployment, error) {
	var (
		d               store.PagesDeployment
		expire, created sql.NullInt64
	)
	if err := sc.Scan(&d.ID, &d.ProjectID, &d.JobID, &d.PathPrefix, &d.Dir, &d.Size, &d.FileCount, &expire, &created); err != nil {
		return nil, err
	}
	d.ExpireAt, d.CreatedAt = timeCol(expire), timeCol(created)
	return &d, nil
}

// listOf runs a query and scans every row.
func listOf[T any](ctx context.Context, s *Store, scan func(scanner) (*T, error), query string, args ...any) ([]*T, error) {
	rows, err := s.query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func limitArg(limit int) int64 {
	if limit <= 0 {
		return math.MaxInt64
	}
	return int64(limit)
}

// EnsureEnvironment implements store.Store.
func (s *Store) EnsureEnvironment(ctx context.Context, e *store.Environment) (bool, error) {
	if e == nil {
		return false, fmt.Errorf("ensuring environment: %w", errInvalid)
	}
	var (
		got     *store.Environment
		created bool
	)
	err := s.write(ctx, func(tx *wtx) error {
		created = false
		old, err := scanEnvironment(tx.queryRow(sqlEnvironmentByName, e.ProjectID, e.Name))
		if err == nil {
			got = old
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		state := e.State
		if state == "" {
			state = store.EnvironmentAvailable
		}
		tier := e.Tier
		if tier == "" {
			tier = "other"
		}
		id, err := tx.insert(sqlCreateEnvironment, e.ProjectID, e.Name, e.Slug, e.ExternalURL, tier, state,
			timeArg(e.AutoStopAt), timeArg(e.CreatedAt), timeArg(e.UpdatedAt))
		if s.isForeignKey(err) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
		}
		got, err = scanEnvironment(tx.queryRow(sqlGetEnvironment, id))
		created = err == nil
		return err
	})
	if err != nil {
		return false, fmt.Errorf("ensuring environment %q of project %d: %w", e.Name, e.ProjectID, err)
	}
	*e = *got
	return created, nil
}

// GetEnvironment implements store.Store.
func (s *Store) GetEnvironment(ctx context.Context, id int64) (*store.Environment, error) {
	e, err := scanEnvironment(s.queryRow(ctx, sqlGetEnvironment, id))
	if err != nil {
		return nil, fmt.Errorf("getting environment %d: %w", id, notFound(err))
	}
	return e, nil
}

// ListEnvironments implements store.Store.
func (s *Store) ListEnvironments(ctx context.Context, projectID int64) ([]*store.Environment, error) {
	out, err := listOf(ctx, s, scanEnvironment, sqlListEnvironments, projectID)
	if err != nil {
		return nil, fmt.Errorf("listing environments of project %d: %w", projectID, err)
	}
	return out, nil
}

// UpdateEnvironment implements store.Store.
func (s *Store) UpdateEnvironment(ctx context.Context, e *store.Environment) error {
	if e == nil {
		return fmt.Errorf("updating environment: %w", errInvalid)
	}
	err := s.write(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlUpdateEnvironment, e.ExternalURL, e.Tier, e.State, timeArg(e.AutoStopAt), timeArg(e.UpdatedAt), e.ID)
		if err == nil && n == 0 {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("updating environment %d: %w", e.ID, err)
	}
	return nil
}

// DueEnvironments implements store.Store.
func (s *Store) DueEnvironments(ctx context.Context, before time.Time, limit int) ([]*store.Environment, error) {
	out, err := listOf(ctx, s, scanEnvironment, sqlDueEnvironments, before.UnixMicro(), limitArg(limit))
	if err != nil {
		return nil, fmt.Errorf("listing environments due to stop: %w", err)
	}
	return out, nil
}

// CreateDeployment implements store.Store.
func (s *Store) CreateDeployment(ctx context.Context, d *store.Deployment) error {
	if d == nil {
		return fmt.Errorf("creating deployment: %w", errInvalid)
	}
	var id, iid int64
	err := s.write(ctx, func(tx *wtx) error {
		var n int
		if err := tx.queryRow(sqlDeploymentOfJob, d.JobID).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return store.ErrExists
		}
		if err := tx.queryRow(sqlNextDeploymentIID, d.ProjectID).Scan(&iid); err != nil {
			return err
		}
		var err error
		id, err = tx.insert(sqlCreateDeployment, iid, d.ProjectID, d.EnvironmentID, d.JobID, d.PipelineID, d.Ref, d.Tag, d.Sha,
			d.Status, d.OnStop, d.AutoStopIn, timeArg(d.CreatedAt), timeArg(d.UpdatedAt), timeArg(d.FinishedAt))
		switch {
		case s.isForeignKey(err):
			return store.ErrNotFound
		case s.isUnique(err):
			return store.ErrExists
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("creating deployment of job %d: %w", d.JobID, err)
	}
	d.ID, d.IID = id, iid
	return nil
}

// UpdateDeployment implements store.Store.
func (s *Store) UpdateDeployment(ctx context.Context, id int64, u store.DeploymentUpdate) (*store.Deployment, error) {
	var out *store.Deployment
	err := s.write(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlUpdateDeployment, u.Status, timeArg(u.UpdatedAt), timeArg(u.FinishedAt), id)
		if err != nil {
			return err
		}
		if n == 0 {
			return store.ErrNotFound
		}
		out, err = scanDeployment(tx.queryRow(sqlGetDeployment, id))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("updating deployment %d: %w", id, err)
	}
	return out, nil
}

// ListDeployments implements store.Store.
func (s *Store) ListDeployments(ctx context.Context, f store.DeploymentFilter) ([]*store.Deployment, error) {
	var (
		where []string
		args  []any
	)
	for _, c := range []struct {
		col string
		v   int64
	}{{"project_id", f.ProjectID}, {"environment_id", f.EnvironmentID}, {"pipeline_id", f.PipelineID}} {
		if c.v != 0 {
			where, args = append(where, c.col+" = ?"), append(args, c.v)
		}
	}
	if len(f.Statuses) > 0 {
		where = append(where, "status IN (?"+strings.Repeat(", ?", len(f.Statuses)-1)+")")
		for _, st := range f.Statuses {
			args = append(args, st)
		}
	}
	q := sqlListDeploymentsBase
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	out, err := listOf(ctx, s, scanDeployment, q+" ORDER BY id", args...)
	if err != nil {
		return nil, fmt.Errorf("listing deployments: %w", err)
	}
	return out, nil
}

// CreateRelease implements store.Store.
func (s *Store) CreateRelease(ctx context.Context, r *store.Release) error {
	if r == nil {
		return fmt.Errorf("creating release: %w", errInvalid)
	}
	milestones, err := stringsArg(r.Milestones)
	if err != nil {
		return err
	}
	var links any
	if len(r.Links) > 0 {
		b, err := json.Marshal(r.Links)
		if err != nil {
			return err
		}
		links = string(b)
	}
	var id int64
	err = s.write(ctx, func(tx *wtx) error {
		var err error
		id, err = tx.insert(sqlCreateRelease, r.ProjectID, r.TagName, r.Name, r.Description, r.Sha, milestones, links, r.JobID,
			timeArg(r.ReleasedAt), timeArg(r.CreatedAt))
		switch {
		case s.isUnique(err):
			return store.ErrExists
		case s.isForeignKey(err):
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("creating release %q of project %d: %w", r.TagName, r.ProjectID, err)
	}
	r.ID = id
	return nil
}

// GetRelease implements store.Store.
func (s *Store) GetRelease(ctx context.Context, projectID int64, tag string) (*store.Release, error) {
	r, err := scanRelease(s.queryRow(ctx, sqlGetRelease, projectID, tag))
	if err != nil {
		return nil, fmt.Errorf("getting release %q of project %d: %w", tag, projectID, notFound(err))
	}
	return r, nil
}

// ListReleases implements store.Store.
func (s *Store) ListReleases(ctx context.Context, projectID int64) ([]*store.Release, error) {
	out, err := listOf(ctx, s, scanRelease, sqlListReleases, projectID)
	if err != nil {
		return nil, fmt.Errorf("listing releases of project %d: %w", projectID, err)
	}
	return out, nil
}

// PutPagesDeployment implements store.Store.
func (s *Store) PutPagesDeployment(ctx context.Context, d *store.PagesDeployment) (*store.PagesDeployment, error) {
	if d == nil {
		return nil, fmt.Errorf("putting pages deployment: %w", errInvalid)
	}
	var (
		id       int64
		replaced *store.PagesDeployment
	)
	err := s.write(ctx, func(tx *wtx) error {
		replaced = nil
		// A deployment outlives its job (no foreign key since migration
		// 13/14), but is made by one that exists.
		if err := missingOr(tx, sqlJobExists, d.JobID, nil); err != nil {
			return err
		}
		old, err := scanPages(tx.queryRow(sqlPagesByPrefix, d.ProjectID, d.PathPrefix))
		switch {
		case err == nil:
			if _, err := tx.exec(sqlDeletePages, old.ID); err != nil {
				return err
			}
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		id, err = tx.insert(sqlInsertPages, d.ProjectID, d.JobID, d.PathPrefix, d.Dir, d.Size, d.FileCount, timeArg(d.ExpireAt), timeArg(d.CreatedAt))
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
		return nil, fmt.Errorf("putting pages deployment of project %d: %w", d.ProjectID, err)
	}
	d.ID = id
	return replaced, nil
}

// ListPagesDeployments implements store.Store.
func (s *Store) ListPagesDeployments(ctx context.Context, projectID int64) ([]*store.PagesDeployment, error) {
	out, err := listOf(ctx, s, scanPages, sqlListPages, projectID)
	if err != nil {
		return nil, fmt.Errorf("listing pages deployments of project %d: %w", projectID, err)
	}
	return out, nil
}

// ExpiredPagesDeployments implements store.Store.
func (s *Store) ExpiredPagesDeployments(ctx context.Context, before time.Time, limit int) ([]*store.PagesDeployment, error) {
	out, err := listOf(ctx, s, scanPages, sqlExpiredPages, before.UnixMicro(), limitArg(limit))
	if err != nil {
		return nil, fmt.Errorf("listing expired pages deployments: %w", err)
	}
	return out, nil
}

// DeletePagesDeployment implements store.Store.
func (s *Store) DeletePagesDeployment(ctx context.Context, id int64) error {
	err := s.write(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlDeletePages, id)
		if err == nil && n == 0 {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("deleting pages deployment %d: %w", id, err)
	}
	return nil
}
