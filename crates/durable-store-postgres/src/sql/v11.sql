-- durable-store-postgres, schema version 11: runs by workflow and status, in the listing order.
--
-- A `list_runs` filter on a workflow and statuses walks this index, one range per status, so its
-- first page reads about a page of entries however rare the status is among the workflow's runs
-- (walking `runs_workflow_created` and checking each row's status read every run of the workflow
-- when few of them had the status). `run_counts` (runs by workflow and status) reads this index
-- alone (an index-only scan, in group order: no sort, no visit of the table's rows).
--
-- A status change moves the run's entry, as it already does in `runs_settled_created` and
-- `runs_active_created` (so a status change was never a HOT update); a step commit, which
-- changes no indexed column, stays one.
--
-- Built inside the migration's transaction (not CONCURRENTLY): writes to the runs wait while
-- an existing table is indexed.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.

CREATE INDEX runs_workflow_status_created ON __SCHEMA__.runs (workflow, status, created_at DESC, id DESC);
