-- Archived traces (docs/coordinator.md, "Traces"): once a job has been
-- finished for a while, its trace moves from trace_chunks to the artifact
-- storage (a local directory or an S3 bucket) and its meta row keeps the
-- object's key; '' means the chunks are in the database.

ALTER TABLE traces ADD COLUMN archive_key TEXT NOT NULL DEFAULT '';
CREATE INDEX traces_unarchived ON traces (job_id) WHERE archive_key = '';
