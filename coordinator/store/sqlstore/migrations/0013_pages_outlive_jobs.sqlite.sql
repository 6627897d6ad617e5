-- SQLite only (0014 is PostgreSQL's): a Pages deployment outlives the job
-- that made it, as in GitLab, so deleting a pipeline does not take its
-- project's site down. job_id stays, no longer a foreign key: it may name
-- a deleted job. SQLite drops a foreign key only by rebuilding the table
-- (its AUTOINCREMENT counter follows the copied ids).

CREATE TABLE pages_deployments_new (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    project_id  BIGINT  NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    job_id      BIGINT  NOT NULL,
    path_prefix TEXT    NOT NULL DEFAULT '',
    dir         TEXT    NOT NULL,
    size        BIGINT  NOT NULL DEFAULT 0,
    file_count  BIGINT  NOT NULL DEFAULT 0,
    expire_at   BIGINT,
    created_at  BIGINT
);
INSERT INTO pages_deployments_new (id, project_id, job_id, path_prefix, dir, size, file_count, expire_at, created_at)
    SELECT id, project_id, job_id, path_prefix, dir, size, file_count, expire_at, created_at FROM pages_deployments;
DROP TABLE pages_deployments;
ALTER TABLE pages_deployments_new RENAME TO pages_deployments;
CREATE UNIQUE INDEX pages_deployments_prefix ON pages_deployments (project_id, path_prefix);
CREATE INDEX pages_deployments_expire ON pages_deployments (expire_at);
