-- Pipeline schedules (GitLab's pipeline schedules API): a pipeline on a
-- ref at every minute a cron expression matches in a time zone. The
-- leading replica's reaper runs the due ones; version makes every write
-- conditional on the schedule as read, so a run is claimed once.
-- owner_id 0 is the admin token; a deleted owner's schedule stays and is
-- deactivated at its next run (GitLab's rule), so no FK.

CREATE TABLE pipeline_schedules (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    project_id    BIGINT  NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    description   TEXT    NOT NULL,
    ref           TEXT    NOT NULL,
    cron          TEXT    NOT NULL,
    cron_timezone TEXT    NOT NULL,
    active        INTEGER NOT NULL DEFAULT 1,
    next_run_at   BIGINT,
    owner_id      BIGINT  NOT NULL DEFAULT 0,
    variables     TEXT,
    inputs        TEXT,
    created_at    BIGINT,
    updated_at    BIGINT,
    version       BIGINT  NOT NULL DEFAULT 1
);
CREATE INDEX pipeline_schedules_project ON pipeline_schedules (project_id);
CREATE INDEX pipeline_schedules_due ON pipeline_schedules (active, next_run_at);

-- The pipelines a schedule created; deleting either removes the link,
-- not the pipeline.
CREATE TABLE pipeline_schedule_pipelines (
    schedule_id BIGINT NOT NULL REFERENCES pipeline_schedules (id) ON DELETE CASCADE,
    pipeline_id BIGINT NOT NULL REFERENCES pipelines (id) ON DELETE CASCADE,
    PRIMARY KEY (schedule_id, pipeline_id)
);
CREATE INDEX pipeline_schedule_pipelines_pipeline ON pipeline_schedule_pipelines (pipeline_id);
