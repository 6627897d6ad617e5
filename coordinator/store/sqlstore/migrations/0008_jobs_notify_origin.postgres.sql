-- PostgreSQL only: the jobs trigger's notifications name the replica whose
-- connection made the change (the berth.replica setting its store
-- connections carry, package postgres's WithReplica), so that replica
-- skips them as it skips its own published events: it queued or dropped
-- the job itself when it made the change. Before, every replica read back
-- each of its own jobs on the notification and, finding it not yet
-- assigned (the assignment still in flight), queued it again; a second
-- runner was then offered it and lost the compare-and-set. Connections
-- without the setting (another tool, an older binary) still sign 'db',
-- which every replica applies.

CREATE OR REPLACE FUNCTION berth_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    was_queued boolean := false;
    is_queued  boolean := NEW.status = 'pending' AND NEW.runner_manager_id = 0;
    origin     text := COALESCE(NULLIF(current_setting('berth.replica', true), ''), 'db');
BEGIN
    IF TG_OP = 'UPDATE' THEN
        was_queued := OLD.status = 'pending' AND OLD.runner_manager_id = 0;
    END IF;
    IF is_queued AND NOT was_queued THEN
        PERFORM pg_notify('berth_events_' || TG_TABLE_SCHEMA, origin || ' q' || NEW.id);
    ELSIF was_queued AND NOT is_queued THEN
        PERFORM pg_notify('berth_events_' || TG_TABLE_SCHEMA, origin || ' t' || NEW.id);
    END IF;
    RETURN NULL;
END
$$;
