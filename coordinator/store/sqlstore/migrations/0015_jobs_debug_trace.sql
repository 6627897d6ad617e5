-- A job whose runner sent its log as a debug trace (PATCH
-- /jobs/:id/trace?debug_trace=true, GitLab's debug_trace_enabled): its log
-- may hold every variable's value, so only the project's developers and
-- admins read it.

ALTER TABLE jobs ADD COLUMN debug_trace INTEGER NOT NULL DEFAULT 0;
