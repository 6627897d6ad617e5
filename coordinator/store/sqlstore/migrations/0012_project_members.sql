-- Project members (GitLab's members API): a user's access level in one
-- project. A maintainer or owner is the project's admin: may fetch its
-- VM snapshots and erase its jobs (docs/snapshots.md). A deleted user's
-- memberships go with it (DeleteUser); a project's with the project.

CREATE TABLE project_members (
    project_id   BIGINT  NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    user_id      BIGINT  NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    access_level INTEGER NOT NULL,
    created_at   BIGINT,
    PRIMARY KEY (project_id, user_id)
);
CREATE INDEX project_members_user ON project_members (user_id);
