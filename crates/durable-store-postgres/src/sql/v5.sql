-- durable-store-postgres, schema version 5: an index for every list_runs filter, each in the
-- listing order (newest first), so a filter's first page reads about a page of index entries
-- however many runs there are; the orphan scan by the end of the lease.
--
-- A step commit changes only `updated_at` and `recovery_attempts` of its run, and no index names
-- them any more (the orphan scan's index used to be on `updated_at`): such an update is a HOT
-- update, which adds no index entry at all, when the row's page has room for the new version —
-- hence a fill factor that leaves some.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.

-- Statuses, in two halves. Settled runs (the history, most of the table) by status; active
-- runs (the working set) in one index without the status. Neither can serve a poller scan (the
-- pollers ask for one active status, and the active index does not lead with it), so the planner
-- keeps walking the pollers' own partial indexes in their order even when its statistics lag a
-- burst of pending or suspended runs.
CREATE INDEX runs_settled_created ON __SCHEMA__.runs (status, created_at DESC, id DESC)
    WHERE status IN ('completed', 'failed', 'cancelled', 'dead');
CREATE INDEX runs_active_created ON __SCHEMA__.runs (created_at DESC, id DESC)
    WHERE status IN ('pending', 'running', 'suspended');
CREATE INDEX runs_workflow_created ON __SCHEMA__.runs (workflow, created_at DESC, id DESC);
CREATE INDEX runs_namespace_created ON __SCHEMA__.runs (namespace, created_at DESC, id DESC);
DROP INDEX __SCHEMA__.runs_parent;
CREATE INDEX runs_parent_created ON __SCHEMA__.runs (parent_id, created_at DESC, id DESC)
    WHERE parent_id IS NOT NULL;
-- Running runs by the time their lease stops holding them (-1: no lease): a scan that finds no
-- orphan reads nothing, however many runs are running.
DROP INDEX __SCHEMA__.runs_running;
CREATE INDEX runs_orphaned ON __SCHEMA__.runs
    ((CASE WHEN lease_owner IS NULL OR lease_until IS NULL THEN -1 ELSE lease_until END))
    WHERE status = 'running';
ALTER TABLE __SCHEMA__.runs SET (fillfactor = 90);
