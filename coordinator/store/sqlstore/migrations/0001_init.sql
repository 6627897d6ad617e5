-- Initial schema of the coordinator store.
--
-- Portable on purpose (a PostgreSQL store follows): standard types only,
-- times are BIGINT unix microseconds in UTC (NULL for "never"/zero), byte
-- strings are BLOB (BYTEA there), lists are JSON arrays in TEXT (NULL when
-- empty), booleans are INTEGER 0/1. The one SQLite spelling is
-- "INTEGER PRIMARY KEY AUTOINCREMENT" (an identity column there): ids are
-- never reused, even after the newest row is deleted.

CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE registration_tokens (
    scope      TEXT   NOT NULL,
    scope_id   BIGINT NOT NULL,
    digest     TEXT   NOT NULL,
    created_at BIGINT,
    PRIMARY KEY (scope, scope_id)
);
CREATE UNIQUE INDEX registration_tokens_digest ON registration_tokens (digest);

CREATE TABLE runners (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    type              TEXT    NOT NULL,
    group_id          BIGINT  NOT NULL DEFAULT 0,
    project_ids       TEXT,
    description       TEXT    NOT NULL DEFAULT '',
    maintenance_note  TEXT    NOT NULL DEFAULT '',
    tags              TEXT,
    run_untagged      INTEGER NOT NULL DEFAULT 0,
    locked            INTEGER NOT NULL DEFAULT 0,
    paused            INTEGER NOT NULL DEFAULT 0,
    access_level      TEXT    NOT NULL DEFAULT '',
    maximum_timeout   BIGINT  NOT NULL DEFAULT 0,
    legacy            INTEGER NOT NULL DEFAULT 0,
    token_digest      TEXT,
    token_obtained_at BIGINT,
    token_expires_at  BIGINT,
    created_at        BIGINT,
    contacted_at      BIGINT
);
-- NULL (no token) may repeat; a digest may not.
CREATE UNIQUE INDEX runners_token_digest ON runners (token_digest);

CREATE TABLE runner_managers (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    runner_id    BIGINT NOT NULL REFERENCES runners (id) ON DELETE CASCADE,
    system_id    TEXT   NOT NULL,
    info         BLOB,
    created_at   BIGINT,
    contacted_at BIGINT
);
CREATE UNIQUE INDEX runner_managers_runner_system ON runner_managers (runner_id, system_id);

CREATE TABLE jobs (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    status            TEXT    NOT NULL,
    project_id        BIGINT  NOT NULL DEFAULT 0,
    namespace_id      BIGINT  NOT NULL DEFAULT 0,
    namespace_ids     TEXT,
    pipeline_id       BIGINT  NOT NULL DEFAULT 0,
    name              TEXT    NOT NULL DEFAULT '',
    stage             TEXT    NOT NULL DEFAULT '',
    ref               TEXT    NOT NULL DEFAULT '',
    protected         INTEGER NOT NULL DEFAULT 0,
    tags              TEXT,
    priority          BIGINT  NOT NULL DEFAULT 0,
    timeout           BIGINT  NOT NULL DEFAULT 0,
    spec              BLOB,
    dependencies      TEXT,
    -- The assignment: runner_manager_id 0 means queued (not handed out).
    token_digest      TEXT,
    runner_id         BIGINT  NOT NULL DEFAULT 0,
    runner_manager_id BIGINT  NOT NULL DEFAULT 0,
    failure_reason    TEXT    NOT NULL DEFAULT '',
    exit_code         BIGINT  NOT NULL DEFAULT 0,
    created_at        BIGINT,
    assigned_at       BIGINT,
    started_at        BIGINT,
    finished_at       BIGINT,
    updated_at        BIGINT
);
-- Queued jobs have no token: keep them out of the index.
CREATE INDEX jobs_token_digest ON jobs (token_digest) WHERE token_digest IS NOT NULL;
CREATE INDEX jobs_status ON jobs (status);
CREATE INDEX jobs_project_id ON jobs (project_id);
CREATE INDEX jobs_pipeline_id ON jobs (pipeline_id);

-- A trace is a row of meta (size and running CRC-32 of all bytes) and the
-- chunks as appended; both change in one transaction.
CREATE TABLE traces (
    job_id BIGINT PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    size   BIGINT NOT NULL,
    crc32  BIGINT NOT NULL
);
CREATE TABLE trace_chunks (
    job_id BIGINT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    pos    BIGINT NOT NULL,
    data   BLOB   NOT NULL,
    PRIMARY KEY (job_id, pos)
);

CREATE TABLE artifacts (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id      BIGINT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    type        TEXT   NOT NULL,
    format      TEXT   NOT NULL DEFAULT '',
    filename    TEXT   NOT NULL DEFAULT '',
    size        BIGINT NOT NULL DEFAULT 0,
    storage_key TEXT   NOT NULL DEFAULT '',
    expire_at   BIGINT,
    created_at  BIGINT
);
-- One artifact per (job, type); also the artifacts(job_id) index.
CREATE UNIQUE INDEX artifacts_job_id_type ON artifacts (job_id, type);
CREATE INDEX artifacts_expire_at ON artifacts (expire_at);
