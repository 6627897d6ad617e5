-- Artifacts listed by type across jobs (the failed jobs' VM snapshots,
-- GET /api/v4/snapshots; docs/coordinator.md).

CREATE INDEX artifacts_type ON artifacts (type, id);
