-- GET /runners/:id/jobs lists a runner's jobs.

CREATE INDEX jobs_runner_id ON jobs (runner_id) WHERE runner_id IS NOT NULL;
