-- Environments and their deployments, releases, and GitLab Pages
-- deployments (docs/ci-yaml.md, "Releases, Pages and environments").
-- Same portable rules as 0001.

CREATE TABLE environments (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    project_id   BIGINT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name         TEXT   NOT NULL,
    slug         TEXT   NOT NULL DEFAULT '',
    external_url TEXT   NOT NULL DEFAULT '',
    tier         TEXT   NOT NULL DEFAULT 'other',
    state        TEXT   NOT NULL DEFAULT 'available',
    auto_stop_at BIGINT,
    created_at   BIGINT,
    updated_at   BIGINT
);
CREATE UNIQUE INDEX environments_project_name ON environments (project_id, name);
CREATE INDEX environments_auto_stop ON environments (auto_stop_at);

CREATE TABLE deployments (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    iid            BIGINT  NOT NULL,
    project_id     BIGINT  NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    environment_id BIGINT  NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    job_id         BIGINT  NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    pipeline_id    BIGINT  NOT NULL DEFAULT 0,
    ref            TEXT    NOT NULL DEFAULT '',
    tag            INTEGER NOT NULL DEFAULT 0,
    sha            TEXT    NOT NULL DEFAULT '',
    status         TEXT    NOT NULL,
    on_stop        TEXT    NOT NULL DEFAULT '',
    auto_stop_in   TEXT    NOT NULL DEFAULT '',
    created_at     BIGINT,
    updated_at     BIGINT,
    finished_at    BIGINT
);
CREATE UNIQUE INDEX deployments_project_iid ON deployments (project_id, iid);
CREATE UNIQUE INDEX deployments_job ON deployments (job_id);
CREATE INDEX deployments_pipeline ON deployments (pipeline_id);
CREATE INDEX deployments_environment ON deployments (environment_id);

CREATE TABLE releases (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    project_id  BIGINT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    tag_name    TEXT   NOT NULL,
    name        TEXT   NOT NULL DEFAULT '',
    description TEXT   NOT NULL DEFAULT '',
    sha         TEXT   NOT NULL DEFAULT '',
    milestones  TEXT,
    links       TEXT,
    job_id      BIGINT NOT NULL DEFAULT 0,
    released_at BIGINT,
    created_at  BIGINT
);
CREATE UNIQUE INDEX releases_project_tag ON releases (project_id, tag_name);

CREATE TABLE pages_deployments (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    project_id  BIGINT  NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    job_id      BIGINT  NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    path_prefix TEXT    NOT NULL DEFAULT '',
    dir         TEXT    NOT NULL,
    size        BIGINT  NOT NULL DEFAULT 0,
    file_count  BIGINT  NOT NULL DEFAULT 0,
    expire_at   BIGINT,
    created_at  BIGINT
);
CREATE UNIQUE INDEX pages_deployments_prefix ON pages_deployments (project_id, path_prefix);
CREATE INDEX pages_deployments_expire ON pages_deployments (expire_at);
