-- durable-store-postgres, schema version 24: a batch's delivery targets found and locked by
-- one index probe each.
--
-- `lock_batch` (version 18) read the waiters of the runs it probes with
-- `w.run_id = ANY (probe)`, found the runs a batch of signals or events delivers to with
-- `w.key = ANY (tokens)` and locked them with `r.id = ANY (targets)`. Without statistics on the
-- tables (a new schema, or autovacuum off) the planner seq-scanned `waiters` for an empty probe
-- list (every batch of signals alone), read every waiter of the kind (its guess for
-- `kind = 'signal'` is a handful of rows) and, for a hundred targets or more, scanned the whole
-- `runs` table, comparing each row with each element: a batch of 150 signals read all 2,000
-- signal waiters twice and all 2,000 runs of the `signals` benchmark, and would read millions of
-- rows at scale. Now each run probed, token, event name and run locked is one index probe (a
-- LATERAL subquery over the array, which the planner cannot turn into a scan of the whole
-- table, and whose cost it guesses small: no JIT), and the runs are still locked in id order.
-- The runs a batch deletes, with their descendants, are read once into an array, and only when
-- it deletes some (the recursive query used to run twice per batch).
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.

CREATE OR REPLACE FUNCTION __SCHEMA__.lock_batch(p jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_tokens text[] := ARRAY(SELECT jsonb_array_elements_text(p -> 'tokens'));
    v_events text[] := ARRAY(SELECT jsonb_array_elements_text(p -> 'events'));
    v_task_runs text[] := ARRAY(SELECT jsonb_array_elements_text(p -> 'task_runs'));
    v_probe text[] := ARRAY(SELECT jsonb_array_elements_text(p -> 'probe'));
    -- The runs the batch deletes and their descendants (read only when it deletes some).
    v_doomed text[] := '{}';
    v_targets text[];
BEGIN
    IF jsonb_array_length(COALESCE(p -> 'delete', '[]'::jsonb)) > 0 THEN
        v_doomed := ARRAY(
            WITH RECURSIVE doomed (id, path) AS (
                SELECT r.id, ARRAY[r.id] FROM __SCHEMA__.runs AS r
                 WHERE r.id = ANY (ARRAY(SELECT jsonb_array_elements_text(p -> 'delete')))
                UNION ALL
                SELECT r.id, d.path || r.id FROM __SCHEMA__.runs AS r JOIN doomed AS d ON r.parent_id = d.id
                 WHERE NOT (r.id = ANY (d.path)))
            SELECT doomed.id FROM doomed);
    END IF;

    -- 1. Every advisory key, ascending (one statement: the locks are taken in the order the
    --    sorted keys are read). The waiters of the runs probed or deleted: one index probe per
    --    run (a LATERAL subquery, which the planner cannot turn into a scan of `waiters`).
    PERFORM pg_advisory_xact_lock(s.k) FROM (SELECT DISTINCT k FROM (
        SELECT __SCHEMA__.lock_key(l.kind, l.key) AS k
          FROM unnest(v_probe || v_doomed) AS t (id),
               LATERAL (SELECT w.kind, w.key FROM __SCHEMA__.waiters AS w
                         WHERE w.run_id = t.id COLLATE "C" OFFSET 0) AS l
        UNION ALL
        SELECT __SCHEMA__.lock_key(k ->> 0, k ->> 1) FROM jsonb_array_elements(p -> 'keys') AS k
        UNION ALL
        SELECT __SCHEMA__.lock_key('buffer', jsonb_build_array(b ->> 0, b ->> 1)::text)
          FROM jsonb_array_elements(p -> 'buffers') AS b
        UNION ALL
        SELECT __SCHEMA__.lock_key('queue', '') WHERE COALESCE((p ->> 'queue')::boolean, false)) AS all_keys
     ORDER BY k) AS s;

    -- 2. The rows of the gates the batch names and of every gate of the runs that settle,
    --    complete a task or are deleted in it (all they may release), in gate order. Gates
    --    without a row yet are created by the operations, in their order.
    IF p ?| ARRAY['gates', 'settles', 'task_runs', 'delete'] THEN
        PERFORM __SCHEMA__.admission_lock(ARRAY(
            SELECT jsonb_array_elements_text(COALESCE(p -> 'gates', '[]'::jsonb))
            UNION
            SELECT unnest(__SCHEMA__.admission_gates_of(r.id)) FROM (
                SELECT jsonb_array_elements_text(COALESCE(p -> 'settles', '[]'::jsonb)) AS id
                UNION SELECT unnest(v_task_runs)
                UNION SELECT unnest(v_doomed)) AS r));
    END IF;

    -- 3. The runs the batch delivers to, when there are two or more: their rows, in id order.
    --    One index probe per token or event name (`waiters_key`) and per run (`runs_pkey`).
    IF cardinality(v_tokens) + cardinality(v_task_runs) < 2 AND cardinality(v_events) = 0 THEN
        RETURN;
    END IF;
    v_targets := ARRAY(
        SELECT l.run_id FROM unnest(v_tokens) AS t (key),
               LATERAL (SELECT w.run_id FROM __SCHEMA__.waiters AS w
                         WHERE w.kind = 'signal' AND w.key = t.key OFFSET 0) AS l
        UNION
        SELECT l.run_id FROM unnest(v_events) AS t (key),
               LATERAL (SELECT w.run_id FROM __SCHEMA__.waiters AS w
                         WHERE w.kind = 'event' AND w.key = t.key OFFSET 0) AS l
        UNION
        SELECT unnest(v_task_runs));
    IF cardinality(v_targets) >= 2 THEN
        -- Locked in id order: the nested loop takes the sorted ids in turn.
        PERFORM count(*) FROM (SELECT DISTINCT t.id COLLATE "C" AS id FROM unnest(v_targets) AS t (id) ORDER BY 1) AS s,
                LATERAL (SELECT r.id FROM __SCHEMA__.runs AS r WHERE r.id = s.id FOR UPDATE) AS l;
    END IF;
END
$$;
