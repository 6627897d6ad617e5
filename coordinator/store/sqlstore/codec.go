package sqlstore

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// Conversions between Go values and columns. Times are BIGINT unix
// microseconds in UTC, NULL for the zero time; lists are JSON arrays in
// TEXT, NULL when empty; empty strings that must not match (digests) are
// NULL.

// timeArg is the column value of t.
func timeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
}

// timeCol reads a time column.
func timeCol(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return time.UnixMicro(v.Int64).UTC()
}

// nullString stores "" as NULL, for columns where "" must not match.
func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// nullInt stores 0 as NULL, for "leave unchanged" COALESCE arguments.
func nullInt(n int) any {
	if n == 0 {
		return nil
	}
	return int64(n)
}

// blobArg stores nil and empty as NULL.
func blobArg(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return b
}

// stringsArg encodes a string list.
func stringsArg(s []string) (any, error) {
	if len(s) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	return string(b), nil
}

// stringsCol decodes a string list.
func stringsCol(v sql.NullString) ([]string, error) {
	if !v.Valid || v.String == "" {
		return nil, nil
	}
	var s []string
	if err := json.Unmarshal([]byte(v.String), &s); err != nil {
		return nil, fmt.Errorf("decoding string list: %w", err)
	}
	return s, nil
}

// idsArg encodes an id list as a JSON array of numbers.
func idsArg(ids []int64) any {
	if len(ids) == 0 {
		return nil
	}
	b := make([]byte, 0, 2+len(ids)*8)
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return string(append(b, ']'))
}

// idsCol decodes an id list.
func idsCol(v sql.NullString) ([]int64, error) {
	if !v.Valid || v.String == "" {
		return nil, nil
	}
	s := v.String
	if len(s) < 2 || s[0] != '[' || s[len(s)-1] != ']' {
		return nil, fmt.Errorf("decoding id list %q: not an array", s)
	}
	s = s[1 : len(s)-1]
	var ids []int64
	for len(s) > 0 {
		end := 0
		for end < len(s) && s[end] != ',' {
			end++
		}
		id, err := strconv.ParseInt(s[:end], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("decoding id list: %w", err)
		}
		ids = append(ids, id)
		if end == len(s) {
			break
		}
		s = s[end+1:]
	}
	return ids, nil
}

// scanner is *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }

func scanRunner(sc scanner) (*store.Runner, error) {
	var (
		r                                     store.Runner
		typ, access                           string
		projectIDs, tags, digest              sql.NullString
		obtained, expires, created, contacted sql.NullInt64
		runUntagged, locked, paused, legacy   bool
		maxTimeout                            int64
	)
	err := sc.Scan(&r.ID, &typ, &r.GroupID, &projectIDs, &r.Description, &r.MaintenanceNote, &tags,
		&runUntagged, &locked, &paused, &access, &maxTimeout, &legacy,
		&digest, &obtained, &expires, &created, &contacted)
	if err != nil {
		return nil, err
	}
	r.Type, r.AccessLevel = store.RunnerType(typ), store.AccessLevel(access)
	r.RunUntagged, r.Locked, r.Paused, r.Legacy = runUntagged, locked, paused, legacy
	r.MaximumTimeout = int(maxTimeout)
	r.TokenDigest = digest.String
	r.TokenObtainedAt, r.TokenExpiresAt = timeCol(obtained), timeCol(expires)
	r.CreatedAt, r.ContactedAt = timeCol(created), timeCol(contacted)
	if r.ProjectIDs, err = idsCol(projectIDs); err != nil {
		return nil, err
	}
	if r.Tags, err = stringsCol(tags); err != nil {
		return nil, err
	}
	return &r, nil
}

func scanManager(sc scanner) (*store.RunnerManager, error) {
	var (
		m                         store.RunnerManager
		created, contacted, fleet sql.NullInt64
	)
	if err := sc.Scan(&m.ID, &m.RunnerID, &m.SystemID, &m.Info, &created, &contacted, &m.Fleet, &fleet); err != nil {
		return nil, err
	}
	m.CreatedAt, m.ContactedAt, m.FleetReportedAt = timeCol(created), timeCol(contacted), timeCol(fleet)
	return &m, nil
}

// jobRow is a jobs row as scanned: cheap to fill inside the writer, decoded
// into a store.Job (lists, times) by the caller, outside it.
type jobRow struct {
	j                                             store.Job
	status                                        string
	nsIDs, tags, deps, digest                     sql.NullString
	priority, timeout, exitCode                   int64
	created, assigned, started, finished, updated sql.NullInt64
	scheduled, queued, erased                     sql.NullInt64
}

func (r *jobRow) scan(sc scanner) error {
	j := &r.j
	return sc.Scan(&j.ID, &r.status, &j.ProjectID, &j.NamespaceID, &r.nsIDs, &j.PipelineID, &j.Name, &j.Stage, &j.Ref,
		&j.Protected, &r.tags, &r.priority, &r.timeout, &j.Spec, &r.deps, &r.digest, &j.RunnerID, &j.RunnerManagerID,
		&j.FailureReason, &r.exitCode, &j.Graph, &j.Retried, &r.scheduled, &r.queued, &r.created, &r.assigned, &r.started, &r.finished, &r.updated,
		&j.Isolation, &r.erased, &j.DebugTrace)
}

func (r *jobRow) job() (*store.Job, error) {
	j := r.j
	j.Status = store.Status(r.status)
	j.Priority, j.Timeout, j.ExitCode = int(r.priority), int(r.timeout), int(r.exitCode)
	j.TokenDigest = r.digest.String
	j.CreatedAt, j.AssignedAt, j.StartedAt = timeCol(r.created), timeCol(r.assigned), timeCol(r.started)
	j.FinishedAt, j.UpdatedAt = timeCol(r.finished), timeCol(r.updated)
	j.ScheduledAt, j.QueuedAt, j.ErasedAt = timeCol(r.scheduled), timeCol(r.queued), timeCol(r.erased)
	var err error
	if j.NamespaceIDs, err = idsCol(r.nsIDs); err != nil {
		return nil, err
	}
	if j.Dependencies, err = idsCol(r.deps); err != nil {
		return nil, err
	}
	if j.Tags, err = stringsCol(r.tags); err != nil {
		return nil, err
	}
	return &j, nil
}

func scanJob(sc scanner) (*store.Job, error) {
	var r jobRow
	if err := r.scan(sc); err != nil {
		return nil, err
	}
	return r.job()
}

func scanArtifact(sc scanner) (*store.Artifact, error) {
	var (
		a               store.Artifact
		expire, created sql.NullInt64
	)
	if err := sc.Scan(&a.ID, &a.JobID, &a.Type, &a.Format, &a.Filename, &a.Size, &a.StorageKey, &expire, &created); err != nil {
		return nil, err
	}
	a.ExpireAt, a.CreatedAt = timeCol(expire), timeCol(created)
	return &a, nil
}

func scanProject(sc scanner) (*store.Project, error) {
	var (
		p       store.Project
		created sql.NullInt64
	)
	if err := sc.Scan(&p.ID, &p.Path, &p.Name, &p.Description, &p.DefaultBranch, &p.Visibility, &created, &p.MinIsolation); err != nil {
		return nil, err
	}
	p.CreatedAt = timeCol(created)
	return &p, nil
}

func scanPipeline(sc scanner) (*store.Pipeline, error) {
	var (
		p                                   store.Pipeline
		status                              string
		created, started, finished, updated sql.NullInt64
		upstream, sourceJob                 sql.NullInt64
		vars                                sql.NullString
	)
	if err := sc.Scan(&p.ID, &p.IID, &p.ProjectID, &p.Ref, &p.Tag, &p.Sha, &p.BeforeSha, &p.Source, &status,
		&p.Protected, &p.YAMLErrors, &p.FailureReason, &created, &started, &finished, &updated,
		&upstream, &sourceJob, &vars); err != nil {
		return nil, err
	}
	p.UpstreamPipelineID, p.SourceJobID = upstream.Int64, sourceJob.Int64
	if vars.Valid && vars.String != "" {
		if err := json.Unmarshal([]byte(vars.String), &p.Variables); err != nil {
			return nil, fmt.Errorf("decoding pipeline variables: %w", err)
		}
	}
	p.Status = store.Status(status)
	p.CreatedAt, p.StartedAt, p.FinishedAt, p.UpdatedAt = timeCol(created), timeCol(started), timeCol(finished), timeCol(updated)
	return &p, nil
}

func scanVariable(sc scanner) (*store.Variable, error) {
	var v store.Variable
	if err := sc.Scan(&v.ProjectID, &v.Key, &v.Value, &v.File, &v.Protected, &v.Masked, &v.Raw, &v.Description); err != nil {
		return nil, err
	}
	return &v, nil
}

// nullInt64 stores 0 as NULL (ids that may be absent).
func nullInt64(n int64) any {
	if n == 0 {
		return nil
	}
	return n
}

// pipelineVarsArg encodes pipeline variables; none is NULL.
func pipelineVarsArg(v []store.PipelineVariable) (any, error) {
	if len(v) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return string(b), nil
}
