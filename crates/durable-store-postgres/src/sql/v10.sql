-- Version 10: a wake sent for a claimed due run carries the claim in its dedupe key
-- (`claim=<until>;...`): the engine that takes it must know the run is due although the claim
-- moved its `wake_at` a lease period ahead. Merging a run's wakes into its one unclaimed item
-- keeps the later key, unless only the earlier one names a claim (as `QueuedRun::fold_wake_key`).
-- `enqueue` and `release_queued` of version 2, with that rule.

-- Queues runs: `{"items": [{run_id, reason, namespace, priority, dedupe_key}], "now"}`, at most one
-- item per run (the client merges duplicates). Items of runs that do not exist are dropped;
-- a missing namespace is the run's, the priority at least the run's. `{"queued": n}`.
CREATE OR REPLACE FUNCTION __SCHEMA__.enqueue(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := (p ->> 'now')::bigint;
    v_namespaces text[];
BEGIN
    PERFORM __SCHEMA__.lock_queue();
    WITH items AS (
        SELECT x ->> 'run_id' AS run_id, x ->> 'reason' AS reason, x ->> 'namespace' AS namespace,
               (x ->> 'priority')::integer AS priority, x ->> 'dedupe_key' AS dedupe_key
          FROM jsonb_array_elements(p -> 'items') AS x),
    queued AS (
        INSERT INTO __SCHEMA__.run_queue AS q (run_id, reason, namespace, priority, dedupe_key, enqueued_at)
        SELECT it.run_id, it.reason, COALESCE(it.namespace, r.namespace), GREATEST(it.priority, r.priority),
               it.dedupe_key, v_now
          FROM items AS it JOIN __SCHEMA__.runs AS r ON r.id = it.run_id
         ORDER BY it.run_id
        ON CONFLICT (run_id) WHERE claimed_by IS NULL DO UPDATE
            SET reason = CASE WHEN excluded.reason = 'wake' THEN 'wake' ELSE q.reason END,
                dedupe_key = CASE WHEN excluded.reason = 'wake'
                                   AND (excluded.dedupe_key LIKE 'claim=%' OR q.dedupe_key NOT LIKE 'claim=%')
                                  THEN excluded.dedupe_key ELSE q.dedupe_key END,
                priority = GREATEST(q.priority, excluded.priority)
        RETURNING q.namespace)
    SELECT ARRAY(SELECT DISTINCT namespace FROM queued) INTO v_namespaces;
    PERFORM __SCHEMA__.notify_queue(ns) FROM unnest(v_namespaces) AS ns;
    RETURN jsonb_build_object('queued', cardinality(v_namespaces));
END
$$;

-- Hands claimed items back, unhandled: each goes back in line (keeping its place), merged into
-- the run's unclaimed item if it has one by now. `{"ids": [...], "owner"}`.
CREATE OR REPLACE FUNCTION __SCHEMA__.release_queued(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_namespaces text[];
BEGIN
    PERFORM __SCHEMA__.lock_queue();
    WITH gone AS (
        DELETE FROM __SCHEMA__.run_queue
         WHERE id = ANY (ARRAY(SELECT (x #>> '{}')::bigint FROM jsonb_array_elements(p -> 'ids') AS x))
           AND claimed_by = p ->> 'owner'
        RETURNING run_id, reason, namespace, priority, dedupe_key, enqueued_at),
    merged AS (
        SELECT DISTINCT ON (run_id) run_id, reason, namespace,
               max(priority) OVER (PARTITION BY run_id) AS priority, dedupe_key,
               min(enqueued_at) OVER (PARTITION BY run_id) AS enqueued_at
          FROM gone
         ORDER BY run_id, (reason = 'wake') DESC, (dedupe_key LIKE 'claim=%') DESC),
    back AS (
        INSERT INTO __SCHEMA__.run_queue AS q (run_id, reason, namespace, priority, dedupe_key, enqueued_at)
        SELECT run_id, reason, namespace, priority, dedupe_key, enqueued_at FROM merged ORDER BY run_id
        ON CONFLICT (run_id) WHERE claimed_by IS NULL DO UPDATE
            SET reason = CASE WHEN excluded.reason = 'wake' THEN 'wake' ELSE q.reason END,
                dedupe_key = CASE WHEN excluded.reason = 'wake'
                                   AND (excluded.dedupe_key LIKE 'claim=%' OR q.dedupe_key NOT LIKE 'claim=%')
                                  THEN excluded.dedupe_key ELSE q.dedupe_key END,
                priority = GREATEST(q.priority, excluded.priority),
                enqueued_at = LEAST(q.enqueued_at, excluded.enqueued_at)
        RETURNING q.namespace)
    SELECT ARRAY(SELECT DISTINCT namespace FROM back) INTO v_namespaces;
    PERFORM __SCHEMA__.notify_queue(ns) FROM unnest(v_namespaces) AS ns;
    RETURN jsonb_build_object('ok', true);
END
$$;
