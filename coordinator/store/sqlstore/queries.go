package sqlstore

import (
	"math"
	"strings"
	"sync"

	"github.com/berthci/berth/coordinator/store"
)

// Every statement of the store is here, written in portable SQL with `?`
// placeholders; a Backend adapts them to its driver (PostgreSQL's
// `$1, $2, …`).

// Settings and registration tokens.
const (
	sqlGetSetting = `SELECT value FROM settings WHERE key = ?`
	sqlPutSetting = `INSERT INTO settings (key, value) VALUES (?, ?)
ON CONFLICT (key) DO UPDATE SET value = excluded.value`

	sqlPutRegistrationToken = `INSERT INTO registration_tokens (scope, scope_id, digest, created_at) VALUES (?, ?, ?, ?)
ON CONFLICT (scope, scope_id) DO UPDATE SET digest = excluded.digest, created_at = excluded.created_at`
	sqlRegistrationTokenByDigest = `SELECT digest, scope, scope_id, created_at FROM registration_tokens WHERE digest = ?`
)

// Runners and managers.
const (
	runnerCols = `id, type, group_id, project_ids, description, maintenance_note, tags,
run_untagged, locked, paused, access_level, maximum_timeout, legacy,
token_digest, token_obtained_at, token_expires_at, created_at, contacted_at`

	sqlCreateRunner = `INSERT INTO runners (type, group_id, project_ids, description, maintenance_note, tags,
run_untagged, locked, paused, access_level, maximum_timeout, legacy,
token_digest, token_obtained_at, token_expires_at, created_at, contacted_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`
	sqlGetRunner           = `SELECT ` + runnerCols + ` FROM runners WHERE id = ?`
	sqlRunnerByTokenDigest = `SELECT ` + runnerCols + ` FROM runners WHERE token_digest = ?`
	sqlListRunners         = `SELECT ` + runnerCols + ` FROM runners ORDER BY id`
	sqlUpdateRunner        = `UPDATE runners SET type = ?, group_id = ?, project_ids = ?, description = ?,
maintenance_note = ?, tags = ?, run_untagged = ?, locked = ?, paused = ?, access_level = ?,
maximum_timeout = ?, legacy = ?, contacted_at = ? WHERE id = ?`
	sqlRotateRunnerToken = `UPDATE runners SET token_digest = ?, token_obtained_at = ?, token_expires_at = ?
WHERE id = ? AND token_digest = ?`
	sqlRunnerExists = `SELECT COUNT(*) FROM runners WHERE id = ?`
	sqlDeleteRunner = `DELETE FROM runners WHERE id = ?`

	managerCols        = `id, runner_id, system_id, info, created_at, contacted_at, fleet, fleet_reported_at`
	sqlUpsertRunnerMgr = `INSERT INTO runner_managers (runner_id, system_id, info, created_at, contacted_at) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (runner_id, system_id) DO UPDATE SET info = excluded.info, contacted_at = excluded.contacted_at
RETURNING id, created_at`
	sqlListRunnerManagers    = `SELECT ` + managerCols + ` FROM runner_managers WHERE runner_id = ? ORDER BY id`
	sqlListAllRunnerManagers = `SELECT ` + managerCols + ` FROM runner_managers ORDER BY id`
	sqlPutRunnerMgrFleet     = `UPDATE runner_managers SET fleet = ?, fleet_reported_at = ? WHERE runner_id = ? AND system_id = ?`
	sqlDeleteRunnerMgr       = `DELETE FROM runner_managers WHERE runner_id = ? AND system_id = ?`
)

// Jobs.
const (
	jobCols = `id, status, project_id, namespace_id, namespace_ids, pipeline_id, name, stage, ref,
protected, tags, priority, timeout, spec, dependencies, token_digest, runner_id, runner_manager_id,
failure_reason, exit_code, graph, retried, scheduled_at, queued_at, created_at, assigned_at, started_at, finished_at, updated_at,
isolation, erased_at, debug_trace`

	sqlCreateJob = `INSERT INTO jobs (status, project_id, namespace_id, namespace_ids, pipeline_id, name, stage, ref,
protected, tags, priority, timeout, spec, dependencies, token_digest, runner_id, runner_manager_id,
failure_reason, exit_code, graph, retried, scheduled_at, queued_at, created_at, assigned_at, started_at, finished_at, updated_at,
isolation)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	sqlGetJob           = `SELECT ` + jobCols + ` FROM jobs WHERE id = ?`
	sqlJobByTokenDigest = `SELECT ` + jobCols + ` FROM jobs WHERE token_digest = ? ORDER BY id DESC LIMIT 1`
	sqlJobExists        = `SELECT COUNT(*) FROM jobs WHERE id = ?`
	// Whether a job exists, and whether it is queued (pending, not handed
	// out), as last committed.
	sqlJobQueued = `SELECT COUNT(*), COALESCE(MAX(CASE WHEN status = 'pending' AND runner_manager_id = 0 THEN 1 ELSE 0 END), 0) FROM jobs WHERE id = ?`
	// A retry marks the old job, if it is finished and not yet retried.
	sqlMarkRetried = `UPDATE jobs SET retried = 1
WHERE id = ? AND retried = 0 AND ` + statusOf + ` IN ('success', 'failed', 'canceled', 'skipped')`

	// Assignment is conditional on the job being queued: pending and not
	// handed out. runner_manager_id 0 marks "not handed out".
	//
	// Statements about one job by id test its status as statusOf, which
	// no index matches: PostgreSQL planned some of them on jobs_status
	// (a tie with the primary key while a new table has no statistics),
	// kept that plan for the connection's life, and then read every
	// pending job's index entry for each assignment and acknowledgement.
	sqlAssignJob = `UPDATE jobs SET runner_id = ?, runner_manager_id = ?, token_digest = ?, assigned_at = ?, updated_at = ?
WHERE id = ? AND ` + statusOf + ` = 'pending' AND runner_manager_id = 0`
	// PostgreSQL: a job another transaction is assigning right now (a
	// replica racing for the same job, its batch not yet committed) is
	// skipped at once rather than waited for; the request takes its next
	// job. The row lock taken by FOR UPDATE makes the assignment as
	// exclusive as the plain conditional update.
	sqlAssignJobSkipLocked = `UPDATE jobs SET runner_id = ?, runner_manager_id = ?, token_digest = ?, assigned_at = ?, updated_at = ?
WHERE id = (SELECT id FROM jobs WHERE id = ? AND ` + statusOf + ` = 'pending' AND runner_manager_id = 0 FOR UPDATE SKIP LOCKED)`
	sqlUnassignJob = `UPDATE jobs SET runner_id = 0, runner_manager_id = 0, token_digest = NULL, assigned_at = NULL
WHERE id = ? AND ` + statusOf + ` = 'pending' AND runner_manager_id = ? AND runner_manager_id <> 0`
	sqlTouchJob       = `UPDATE jobs SET updated_at = ? WHERE id = ? AND ` + statusOf + ` NOT IN ('success', 'failed', 'canceled', 'skipped')`
	sqlMarkDebugTrace = `UPDATE jobs SET debug_trace = 1 WHERE id = ? AND debug_trace = 0`
)

// ByIDStatements are the statements that find one job by its id and test
// its status (statusOf), for the PostgreSQL store's test of their plans.
func ByIDStatements() []string {
	const (
		failureReason transitionSet = 1 << iota // transitionCols' order
		exitCode
		startedAt
		finishedAt
		updatedAt
	)
	return []string{sqlAssignJob, sqlAssignJobSkipLocked, sqlUnassignJob, sqlTouchJob, sqlMarkRetried,
		transitionJobQuery(startedAt|updatedAt|transitionIfDigest, 1),      // an acknowledgement
		transitionJobQuery(failureReason|exitCode|finishedAt|updatedAt, 3)} // a job's end
}

// ByDigestStatements are the statements that find a row by a token's
// digest, each with the index that must find it (a request with a bad
// token runs them: a scan would let anyone make the store read every
// row), for the PostgreSQL store's test of their plans.
func ByDigestStatements() map[string]string {
	return map[string]string{sqlJobByTokenDigest: "jobs_token_digest", sqlRunnerByTokenDigest: "runners_token_digest"}
}

// statusOf is a job's status in a statement that finds the job by id: the
// same text, as an expression the jobs_status index does not cover, so
// that only the primary key can find the row (see sqlAssignJob).
const statusOf = "(status || '')"

// Projects, pipelines and variables.
const (
	projectCols        = `id, path, name, description, default_branch, visibility, created_at, min_isolation`
	sqlCreateProject   = `INSERT INTO projects (path, name, description, default_branch, visibility, created_at, min_isolation) VALUES (?, ?, ?, ?, ?, ?, ?)`
	sqlUpdateProject   = `UPDATE projects SET name = ?, description = ?, default_branch = ?, visibility = ?, min_isolation = ? WHERE id = ?`
	sqlGetProject      = `SELECT ` + projectCols + ` FROM projects WHERE id = ?`
	sqlProjectByPath   = `SELECT ` + projectCols + ` FROM projects WHERE path = ?`
	sqlListProjects    = `SELECT ` + projectCols + ` FROM projects ORDER BY id`
	sqlProjectExists   = `SELECT COUNT(*) FROM projects WHERE id = ?`
	pipelineCols       = `id, iid, project_id, ref, tag, sha, before_sha, source, status, protected, yaml_errors, failure_reason, created_at, started_at, finished_at, updated_at, upstream_pipeline_id, source_job_id, variables`
	sqlNextPipelineIID = `SELECT COALESCE(MAX(iid), 0) + 1 FROM pipelines WHERE project_id = ?`
	sqlCreatePipeline  = `INSERT INTO pipelines (iid, project_id, ref, tag, sha, before_sha, source, status, protected, yaml_errors, failure_reason, created_at, started_at, finished_at, updated_at, upstream_pipeline_id, source_job_id, variables) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	sqlGetPipeline     = `SELECT ` + pipelineCols + ` FROM pipelines WHERE id = ?`
	sqlPipelineExists  = `SELECT COUNT(*) FROM pipelines WHERE id = ?`
	sqlUpdatePipeline  = `UPDATE pipelines SET status = ?, started_at = COALESCE(?, started_at),
finished_at = CASE WHEN ? = 1 THEN NULL ELSE COALESCE(?, finished_at) END, updated_at = COALESCE(?, updated_at),
failure_reason = COALESCE(NULLIF(?, ''), failure_reason), yaml_errors = COALESCE(NULLIF(?, ''), yaml_errors)
WHERE id = ? RETURNING ` + pipelineCols
	variableCols      = `project_id, key, value, file, protected, masked, raw, description`
	sqlCreateVariable = `INSERT INTO project_variables (` + variableCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`
	sqlUpdateVariable = `UPDATE project_variables SET value = ?, file = ?, protected = ?, masked = ?, raw = ?, description = ?
WHERE project_id = ? AND key = ?`
	sqlGetVariable    = `SELECT ` + variableCols + ` FROM project_variables WHERE project_id = ? AND key = ?`
	sqlListVariables  = `SELECT ` + variableCols + ` FROM project_variables WHERE project_id = ? ORDER BY key`
	sqlDeleteVariable = `DELETE FROM project_variables WHERE project_id = ? AND key = ?`
)

// listPipelinesQuery builds the ListPipelines query for f.
func listPipelinesQuery(f store.PipelineFilter) (string, []any) {
	var where []string
	var args []any
	if f.ProjectID != 0 {
		where = append(where, "project_id = ?")
		args = append(args, f.ProjectID)
	}
	if len(f.Statuses) > 0 {
		where = append(where, "status IN (?"+strings.Repeat(", ?", len(f.Statuses)-1)+")")
		for _, s := range f.Statuses {
			args = append(args, string(s))
		}
	}
	if f.Ref != "" {
		where = append(where, "ref = ?")
		args = append(args, f.Ref)
	}
	if f.Sha != "" {
		where = append(where, "sha = ?")
		args = append(args, f.Sha)
	}
	if f.UpstreamPipelineID != 0 {
		where = append(where, "upstream_pipeline_id = ?")
		args = append(args, f.UpstreamPipelineID)
	}
	if f.SourceJobID != 0 {
		where = append(where, "source_job_id = ?")
		args = append(args, f.SourceJobID)
	}
	if f.Source != "" {
		where = append(where, "source = ?")
		args = append(args, f.Source)
	}
	if f.ScheduleID != 0 {
		where = append(where, "id IN (SELECT pipeline_id FROM pipeline_schedule_pipelines WHERE schedule_id = ?)")
		args = append(args, f.ScheduleID)
	}
	var b strings.Builder
	b.WriteString("SELECT " + pipelineCols + " FROM pipelines")
	if len(where) > 0 {
		b.WriteString(" WHERE " + strings.Join(where, " AND "))
	}
	if f.Newest {
		b.WriteString(" ORDER BY id DESC")
	} else {
		b.WriteString(" ORDER BY id")
	}
	if f.Limit > 0 || f.Offset > 0 {
		limit := int64(f.Limit)
		if limit <= 0 {
			limit = math.MaxInt64 // "no limit" in both SQLite and PostgreSQL
		}
		b.WriteString(" LIMIT ? OFFSET ?")
		args = append(args, limit, max(f.Offset, 0))
	}
	return b.String(), args
}

// transitionJobQuery builds the TransitionJob statement: only the columns
// the update sets, and as many from-status slots as statuses given, so the
// hot path (an ack sets three columns from one status) binds few
// arguments. The variants are few; each is prepared once and kept.
func transitionJobQuery(set transitionSet, nFrom int) string {
	key := uint32(set)<<8 | uint32(nFrom)
	if q, ok := transitionQueries.Load(key); ok {
		return q.(string)
	}
	var b strings.Builder
	b.WriteString("UPDATE jobs SET status = ?")
	for i, col := range transitionCols {
		if set&(1<<i) != 0 {
			b.WriteString(", " + col + " = ?")
		}
	}
	b.WriteString(" WHERE id = ?")
	if set&transitionIfDigest != 0 {
		// As statusOf: not an indexed expression, so that the primary
		// key alone finds the row.
		b.WriteString(" AND (token_digest || '') = ?")
	}
	b.WriteString(" AND " + statusOf + " IN (?" + strings.Repeat(", ?", max(nFrom, 1)-1) + ") RETURNING " + jobCols)
	q := b.String()
	transitionQueries.Store(key, q)
	return q
}

// transitionSet has bit i set when transitionCols[i] is written.
type transitionSet uint32

// transitionCols are the columns a JobUpdate may set besides status.
var transitionCols = []string{"failure_reason", "exit_code", "started_at", "finished_at", "updated_at",
	"scheduled_at", "queued_at", "dependencies", "erased_at", "runner_id", "runner_manager_id", "token_digest", "assigned_at"}

// transitionAssign is the bits of the assignment's columns.
const transitionAssign transitionSet = 0xf << 9

// transitionIfDigest marks the condition on the job's token digest
// (JobUpdate.IfTokenDigest): a WHERE term, not a column set.
const transitionIfDigest transitionSet = 1 << 23

var transitionQueries sync.Map // key → query

// listJobsQuery builds the ListJobs query for f.
func listJobsQuery(f store.JobFilter) (string, []any) {
	var where []string
	var args []any
	if len(f.IDs) > 0 {
		where = append(where, "id IN (?"+strings.Repeat(", ?", len(f.IDs)-1)+")")
		for _, id := range f.IDs {
			args = append(args, id)
		}
	}
	if len(f.Statuses) > 0 {
		where = append(where, "status IN (?"+strings.Repeat(", ?", len(f.Statuses)-1)+")")
		for _, s := range f.Statuses {
			args = append(args, string(s))
		}
	}
	if f.ProjectID != 0 {
		where = append(where, "project_id = ?")
		args = append(args, f.ProjectID)
	}
	if f.PipelineID != 0 {
		where = append(where, "pipeline_id = ?")
		args = append(args, f.PipelineID)
	}
	if f.RunnerID != 0 {
		where = append(where, "runner_id = ?")
		args = append(args, f.RunnerID)
	}
	if !f.UpdatedBefore.IsZero() {
		where = append(where, "updated_at < ?")
		args = append(args, f.UpdatedBefore.UnixMicro())
	}
	var b strings.Builder
	b.WriteString("SELECT " + jobCols + " FROM jobs")
	if len(where) > 0 {
		b.WriteString(" WHERE " + strings.Join(where, " AND "))
	}
	b.WriteString(" ORDER BY id")
	if f.Limit > 0 {
		b.WriteString(" LIMIT ?")
		args = append(args, f.Limit)
	}
	return b.String(), args
}

// Traces.
const (
	// The job row and its trace meta, if any: one read tells "no job"
	// from "no trace yet".
	sqlTraceMeta = `SELECT t.size, t.crc32, t.archive_key FROM jobs j LEFT JOIN traces t ON t.job_id = j.id WHERE j.id = ?`
	// An append moves the meta row by compare-and-set on the size (and
	// the trace being in the database); the first append of a trace
	// creates it unless another did.
	sqlAdvanceTrace = `UPDATE traces SET size = ?, crc32 = ? WHERE job_id = ? AND size = ? AND archive_key = ''`
	sqlStartTrace   = `INSERT INTO traces (job_id, size, crc32) VALUES (?, ?, ?) ON CONFLICT (job_id) DO NOTHING`
	sqlInsertChunk  = `INSERT INTO trace_chunks (job_id, pos, data) VALUES (?, ?, ?)`
	// Chunks holding bytes at or after an offset.
	sqlReadChunks   = `SELECT pos, data FROM trace_chunks WHERE job_id = ? AND pos + length(data) > ? ORDER BY pos`
	sqlDeleteChunks = `DELETE FROM trace_chunks WHERE job_id = ?`
	sqlDeleteTrace  = `DELETE FROM traces WHERE job_id = ? AND archive_key = ''`
	// Archiving sets the key by compare-and-set on the size an archiver
	// copied; bringing a trace back clears it by compare-and-set on the
	// key, size and CRC it read.
	sqlArchiveTrace   = `UPDATE traces SET archive_key = ? WHERE job_id = ? AND size = ? AND archive_key = ''`
	sqlUnarchiveTrace = `UPDATE traces SET archive_key = '' WHERE job_id = ? AND archive_key = ? AND size = ? AND crc32 = ?`
	// Finished jobs whose trace is still in the database, oldest first.
	sqlTracesToArchive = `SELECT t.job_id FROM traces t JOIN jobs j ON j.id = t.job_id
WHERE t.archive_key = '' AND j.status IN ('success', 'failed', 'canceled', 'skipped') AND j.finished_at IS NOT NULL AND j.finished_at < ?
ORDER BY t.job_id LIMIT ?`
)

// Artifacts.
const (
	artifactCols        = `id, job_id, type, format, filename, size, storage_key, expire_at, created_at`
	sqlArtifactByType   = `SELECT ` + artifactCols + ` FROM artifacts WHERE job_id = ? AND type = ?`
	sqlDeleteArtifact   = `DELETE FROM artifacts WHERE id = ?`
	sqlInsertArtifact   = `INSERT INTO artifacts (job_id, type, format, filename, size, storage_key, expire_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`
	sqlListArtifacts    = `SELECT ` + artifactCols + ` FROM artifacts WHERE job_id = ? ORDER BY id`
	sqlArtifactsOfType  = `SELECT ` + artifactCols + ` FROM artifacts WHERE type = ? ORDER BY id`
	sqlExpiredArtifacts = `SELECT ` + artifactCols + ` FROM artifacts WHERE expire_at IS NOT NULL AND expire_at < ? ORDER BY expire_at, id LIMIT ?`
)
