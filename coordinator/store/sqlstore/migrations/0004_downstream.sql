-- Downstream pipelines (trigger jobs, docs/ci-yaml.md): a pipeline
-- created by a bridge job records the upstream pipeline and the bridge
-- (GitLab's ci_sources_pipelines, one row per downstream pipeline, kept
-- on the pipeline itself); a bridge's downstream pipeline is the one
-- whose source_job_id is the bridge. variables holds the pipeline
-- variables a pipeline was created with (JSON), for
-- forward:pipeline_variables. Same portable rules as 0001.

ALTER TABLE pipelines ADD COLUMN upstream_pipeline_id BIGINT;
ALTER TABLE pipelines ADD COLUMN source_job_id BIGINT;
ALTER TABLE pipelines ADD COLUMN variables TEXT;
CREATE INDEX pipelines_upstream ON pipelines (upstream_pipeline_id);
CREATE INDEX pipelines_source_job ON pipelines (source_job_id);
