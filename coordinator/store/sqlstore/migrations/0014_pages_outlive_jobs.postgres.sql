-- PostgreSQL only (0013 is SQLite's): a Pages deployment outlives the job
-- that made it, as in GitLab, so deleting a pipeline does not take its
-- project's site down. job_id stays, no longer a foreign key: it may name
-- a deleted job.

ALTER TABLE pages_deployments DROP CONSTRAINT IF EXISTS pages_deployments_job_id_fkey;
