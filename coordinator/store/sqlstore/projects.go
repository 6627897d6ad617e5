package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/berthci/berth/coordinator/store"
)

// CreateProject inserts p and sets p.ID; store.ErrExists if the path is
// taken.
func (s *Store) CreateProject(ctx context.Context, p *store.Project) error {
	if p == nil {
		return fmt.Errorf("creating project: %w", errInvalid)
	}
	vis := p.Visibility
	if vis == "" {
		vis = "private"
	}
	var id int64
	err := s.write(ctx, func(tx *wtx) error {
		var err error
		id, err = tx.insert(sqlCreateProject, p.Path, p.Name, p.Description, p.DefaultBranch, vis, timeArg(p.CreatedAt), p.MinIsolation)
		if s.isUnique(err) {
			return store.ErrExists
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("creating project %q: %w", p.Path, err)
	}
	p.ID, p.Visibility = id, vis
	return nil
}

// UpdateProject writes p's settable fields; store.ErrNotFound if absent.
func (s *Store) UpdateProject(ctx context.Context, p *store.Project) error {
	if p == nil {
		return fmt.Errorf("updating project: %w", errInvalid)
	}
	vis := p.Visibility
	if vis == "" {
		vis = "private"
	}
	err := s.write(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlUpdateProject, p.Name, p.Description, p.DefaultBranch, vis, p.MinIsolation, p.ID)
		if err == nil && n == 0 {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("updating project %d: %w", p.ID, err)
	}
	p.Visibility = vis
	return nil
}

// GetProject returns project id.
func (s *Store) GetProject(ctx context.Context, id int64) (*store.Project, error) {
	p, err := scanProject(s.queryRow(ctx, sqlGetProject, id))
	if err != nil {
		return nil, fmt.Errorf("getting project %d: %w", id, notFound(err))
	}
	return p, nil
}

// ProjectByPath returns the project with the full path.
func (s *Store) ProjectByPath(ctx context.Context, path string) (*store.Project, error) {
	p, err := scanProject(s.queryRow(ctx, sqlProjectByPath, path))
	if err != nil {
		return nil, fmt.Errorf("getting project %q: %w", path, notFound(err))
	}
	return p, nil
}

// ListProjects returns all projects ordered by ID.
func (s *Store) ListProjects(ctx context.Context) ([]*store.Project, error) {
	rows, err := s.query(ctx, sqlListProjects)
	if err != nil {
		return nil, fmt.Errorf("listing projects: %w", err)
	}
	defer rows.Close()
	var out []*store.Project
	for rows.Next() {
		p, err := scanProject(rows)
		if err != nil {
			return nil, fmt.Errorf("listing projects: %w", err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing projects: %w", err)
	}
	return out, nil
}

// CreatePipeline inserts p with the project's next IID.
func (s *Store) CreatePipeline(ctx context.Context, p *store.Pipeline) error {
	if p == nil {
		return fmt.Errorf("creating pipeline: %w", errInvalid)
	}
	st := p.Status
	if st == "" {
		st = store.StatusCreated
	}
	if !knownStatus(st) {
		return fmt.Errorf("creating pipeline with status %q: %w", p.Status, errStatus)
	}
	vars, err := pipelineVarsArg(p.Variables)
	if err != nil {
		return fmt.Errorf("creating pipeline of project %d: %w", p.ProjectID, err)
	}
	var id, iid int64
	err = s.write(ctx, func(tx *wtx) error {
		var n int
		if err := tx.queryRow(sqlProjectExists, p.ProjectID).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return store.ErrNotFound
		}
		if err := tx.queryRow(sqlNextPipelineIID, p.ProjectID).Scan(&iid); err != nil {
			return err
		}
		var err error
		id, err = tx.insert(sqlCreatePipeline, iid, p.ProjectID, p.Ref, p.Tag, p.Sha, p.BeforeSha, p.Source, string(st),
			p.Protected, p.YAMLErrors, p.FailureReason, timeArg(p.CreatedAt), timeArg(p.StartedAt), timeArg(p.FinishedAt), timeArg(p.UpdatedAt),
			nullInt64(p.UpstreamPipelineID), nullInt64(p.SourceJobID), vars)
		return err
	})
	if err != nil {
		return fmt.Errorf("creating pipeline of project %d: %w", p.ProjectID, err)
	}
	p.ID, p.IID, p.Status = id, iid, st
	return nil
}

// GetPipeline returns pipeline id.
func (s *Store) GetPipeline(ctx context.Context, id int64) (*store.Pipeline, error) {
	p, err := scanPipeline(s.queryRow(ctx, sqlGetPipeline, id))
	if err != nil {
		return nil, fmt.Errorf("getting pipeline %d: %w", id, notFound(err))
	}
	return p, nil
}

// ListPipelines returns the pipelines matching f.
func (s *Store) ListPipelines(ctx context.Context, f store.PipelineFilter) ([]*store.Pipeline, error) {
	q, args := listPipelinesQuery(f)
	rows, err := s.query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing pipelines: %w", err)
	}
	defer rows.Close()
	var out []*store.Pipeline
	for rows.Next() {
		p, err := scanPipeline(rows)
		if err != nil {
			return nil, fmt.Errorf("listing pipelines: %w", err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing pipelines: %w", err)
	}
	return out, nil
}

// UpdatePipeline applies u to pipeline id.
func (s *Store) UpdatePipeline(ctx context.Context, id int64, u store.PipelineUpdate) (*store.Pipeline, error) {
	if !knownStatus(u.Status) {
		return nil, fmt.Errorf("updating pipeline %d to %q: %w", id, u.Status, errStatus)
	}
	clearFinished := 0
	if u.ClearFinished {
		clearFinished = 1
	}
	var p *store.Pipeline
	err := s.writeRow(ctx, func(tx *wtx) error {
		var err error
		p, err = scanPipeline(tx.queryRow(sqlUpdatePipeline, string(u.Status), timeArg(u.StartedAt), clearFinished,
			timeArg(u.FinishedAt), timeArg(u.UpdatedAt), u.FailureReason, u.YAMLErrors, id))
		if errors.Is(err, sql.ErrNoRows) {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("updating pipeline %d: %w", id, err)
	}
	return p, nil
}

// CreateVariable inserts v.
func (s *Store) CreateVariable(ctx context.Context, v *store.Variable) error {
	if v == nil {
		return fmt.Errorf("creating variable: %w", errInvalid)
	}
	err := s.write(ctx, func(tx *wtx) error {
		_, err := tx.exec(sqlCreateVariable, v.ProjectID, v.Key, v.Value, v.File, v.Protected, v.Masked, v.Raw, v.Description)
		switch {
		case s.isUnique(err):
			return store.ErrExists
		case s.isForeignKey(err):
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("creating variable %q of project %d: %w", v.Key, v.ProjectID, err)
	}
	return nil
}

// UpdateVariable replaces an existing variable.
func (s *Store) UpdateVariable(ctx context.Context, v *store.Variable) error {
	if v == nil {
		return fmt.Errorf("updating variable: %w", errInvalid)
	}
	err := s.write(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlUpdateVariable, v.Value, v.File, v.Protected, v.Masked, v.Raw, v.Description, v.ProjectID, v.Key)
		if err == nil && n == 0 {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("updating variable %q of project %d: %w", v.Key, v.ProjectID, err)
	}
	return nil
}

// GetVariable returns one variable.
func (s *Store) GetVariable(ctx context.Context, projectID int64, key string) (*store.Variable, error) {
	v, err := scanVariable(s.queryRow(ctx, sqlGetVariable, projectID, key))
	if err != nil {
		return nil, fmt.Errorf("getting variable %q of project %d: %w", key, projectID, notFound(err))
	}
	return v, nil
}

// ListVariables returns a project's variables ordered by key.
func (s *Store) ListVariables(ctx context.Context, projectID int64) ([]*store.Variable, error) {
	rows, err := s.query(ctx, sqlListVariables, projectID)
	if err != nil {
		return nil, fmt.Errorf("listing variables of project %d: %w", projectID, err)
	}
	defer rows.Close()
	var out []*store.Variable
	for rows.Next() {
		v, err := scanVariable(rows)
		if err != nil {
			return nil, fmt.Errorf("listing variables of project %d: %w", projectID, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing variables of project %d: %w", projectID, err)
	}
	return out, nil
}

// DeleteVariable removes a variable.
func (s *Store) DeleteVariable(ctx context.Context, projectID int64, key string) error {
	err := s.write(ctx, func(tx *wtx) error {
		n, err := tx.exec(sqlDeleteVariable, projectID, key)
		if err == nil && n == 0 {
			return store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("deleting variable %q of project %d: %w", key, projectID, err)
	}
	return nil
}

const (
	sqlDeletePipelineJobs = `DELETE FROM jobs WHERE pipeline_id = ?`
	sqlDeletePipeline     = `DELETE FROM pipelines WHERE id = ?`
)

// DeletePipeline removes a pipeline and its jobs in one transaction; the
// jobs' traces, trace chunks, artifact records and deployments go by
// their foreign keys' cascade.
func (s *Store) DeletePipeline(ctx context.Context, id int64) error {
	if id <= 0 {
		return fmt.Errorf("deleting pipeline %d: %w", id, store.ErrNotFound)
	}
	err := s.write(ctx, func(tx *wtx) error {
		if _, err := tx.exec(sqlDeletePipelineJobs, id); err != nil {
			return err
		}
		n, err := tx.exec(sqlDeletePipeline, id)
		if err == nil && n == 0 {
			err = store.ErrNotFound
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("deleting pipeline %d: %w", id, err)
	}
	return nil
}
