-- The web UI (docs/ui.md): users who sign in with a token of their own
-- (admin or read-only; only the token's digest is kept) and their
-- sessions (only the digest of the cookie's secret is kept). A session of
-- the admin token has user_id 0. And each runner manager's last fleet
-- report (its autoscaler's instances, slots and cost so far), so every
-- replica shows it.

CREATE TABLE users (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    name         TEXT   NOT NULL,
    role         TEXT   NOT NULL,
    token_digest TEXT   NOT NULL,
    created_at   BIGINT
);
CREATE UNIQUE INDEX users_name ON users (name);
CREATE UNIQUE INDEX users_token_digest ON users (token_digest);

CREATE TABLE sessions (
    digest            TEXT PRIMARY KEY,
    user_id           BIGINT NOT NULL DEFAULT 0,
    credential_digest TEXT   NOT NULL,
    created_at        BIGINT,
    expires_at        BIGINT NOT NULL
);
CREATE INDEX sessions_user ON sessions (user_id);
CREATE INDEX sessions_expires ON sessions (expires_at);

ALTER TABLE runner_managers ADD COLUMN fleet BLOB;
ALTER TABLE runner_managers ADD COLUMN fleet_reported_at BIGINT;
