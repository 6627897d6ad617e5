-- PostgreSQL only: the jobs table tells coordinator replicas sharing the
-- database when a job enters or leaves the queue (pending and not handed
-- out), on the channel they listen on (package cluster). A trigger, not the
-- coordinator, sends it: the notification is delivered exactly when the
-- change commits, so a replica that dies between its write and its own
-- message cannot leave the others without a queued job.

CREATE FUNCTION berth_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    was_queued boolean := false;
    is_queued  boolean := NEW.status = 'pending' AND NEW.runner_manager_id = 0;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        was_queued := OLD.status = 'pending' AND OLD.runner_manager_id = 0;
    END IF;
    IF is_queued AND NOT was_queued THEN
        PERFORM pg_notify('berth_events_' || TG_TABLE_SCHEMA, 'db q' || NEW.id);
    ELSIF was_queued AND NOT is_queued THEN
        PERFORM pg_notify('berth_events_' || TG_TABLE_SCHEMA, 'db t' || NEW.id);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify AFTER INSERT OR UPDATE OF status, runner_manager_id ON jobs
    FOR EACH ROW EXECUTE FUNCTION berth_jobs_notify();
