-- When a job's artifacts and log were erased (GitLab's POST
-- /projects/:id/jobs/:job_id/erase, the job's erased_at); NULL: never.

ALTER TABLE jobs ADD COLUMN erased_at BIGINT;
