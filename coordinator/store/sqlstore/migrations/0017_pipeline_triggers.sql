-- Pipeline trigger tokens (GitLab's pipeline triggers API): a token that
-- creates a project's pipelines with its owner's access. Only the
-- token's digest is kept, and its first characters to tell tokens apart.
-- owner_id 0 is the admin token.

CREATE TABLE pipeline_triggers (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    project_id   BIGINT  NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    description  TEXT    NOT NULL DEFAULT '',
    owner_id     BIGINT  NOT NULL DEFAULT 0,
    token_digest TEXT    NOT NULL UNIQUE,
    token_hint   TEXT    NOT NULL DEFAULT '',
    created_at   BIGINT,
    updated_at   BIGINT,
    last_used    BIGINT,
    expires_at   BIGINT
);
CREATE INDEX pipeline_triggers_project ON pipeline_triggers (project_id);
