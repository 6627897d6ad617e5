-- Projects with their git repositories, pipelines, project variables, and
-- the job columns pipelines need. Same portable rules as 0001.

CREATE TABLE projects (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    path           TEXT   NOT NULL,
    name           TEXT   NOT NULL DEFAULT '',
    description    TEXT   NOT NULL DEFAULT '',
    default_branch TEXT   NOT NULL DEFAULT '',
    visibility     TEXT   NOT NULL DEFAULT 'private',
    created_at     BIGINT
);
CREATE UNIQUE INDEX projects_path ON projects (path);

CREATE TABLE pipelines (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    iid            BIGINT  NOT NULL,
    project_id     BIGINT  NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    ref            TEXT    NOT NULL DEFAULT '',
    tag            INTEGER NOT NULL DEFAULT 0,
    sha            TEXT    NOT NULL DEFAULT '',
    before_sha     TEXT    NOT NULL DEFAULT '',
    source         TEXT    NOT NULL DEFAULT '',
    status         TEXT    NOT NULL,
    protected      INTEGER NOT NULL DEFAULT 0,
    yaml_errors    TEXT    NOT NULL DEFAULT '',
    failure_reason TEXT    NOT NULL DEFAULT '',
    created_at     BIGINT,
    started_at     BIGINT,
    finished_at    BIGINT,
    updated_at     BIGINT
);
CREATE UNIQUE INDEX pipelines_project_iid ON pipelines (project_id, iid);
CREATE INDEX pipelines_status ON pipelines (status);

CREATE TABLE project_variables (
    project_id  BIGINT  NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    key         TEXT    NOT NULL,
    value       TEXT    NOT NULL DEFAULT '',
    file        INTEGER NOT NULL DEFAULT 0,
    protected   INTEGER NOT NULL DEFAULT 0,
    masked      INTEGER NOT NULL DEFAULT 0,
    raw         INTEGER NOT NULL DEFAULT 0,
    description TEXT    NOT NULL DEFAULT '',
    PRIMARY KEY (project_id, key)
);

ALTER TABLE jobs ADD COLUMN graph BLOB;
ALTER TABLE jobs ADD COLUMN retried INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN scheduled_at BIGINT;
ALTER TABLE jobs ADD COLUMN queued_at BIGINT;
