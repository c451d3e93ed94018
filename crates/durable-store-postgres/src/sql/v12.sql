-- durable-store-postgres, schema version 12: one lock order for a whole batch.
--
-- The writer folds the writes of many callers into one transaction (`apply`), and with
-- `write_connections` > 1 several batches are in flight at once. Each operation takes its locks
-- in a good order for itself (advisory keys ascending, then rows), but a batch took them
-- operation by operation, so two batches could take the same keys, or wake the same runs, in
-- opposite orders and deadlock (PostgreSQL breaks a deadlock after `deadlock_timeout`, 1 s by
-- default, and the writer runs the batch again). The usual case: the children of several
-- parents finishing in two concurrent batches, each batch waking the parents in its own order.
--
-- `apply(ops, channel, locks)` takes, before the first operation runs, what the client says the
-- batch's operations lock (`ops::BatchLocks`: plain lists, so the server does not walk the
-- operations' JSON), in `lock_batch`:
-- 1. Every advisory key any operation takes, ascending: the keys of all the waiters
--    of a commit's run and of a patched run, of a deleted run and its descendants, of the waits a
--    commit registers, of every signal token and task result token, event name, trigger buffer,
--    and the queue lock. The operations take them again as they run (held already: no wait).
-- 2. If the batch delivers to two or more runs (the runs of the waiters on its signal tokens and
--    event names, read under those keys, so they are the runs it will wake, and the runs of its
--    task results), their rows, in id order (`SELECT … ORDER BY id FOR UPDATE`).
--
-- Why that is enough for the runs: a delivery takes one of the run's waiters under that waiter's
-- key, and a commit of the run (a patch, a delete) takes the keys of all the run's waiters; every
-- batch holds all its keys before its first row lock, so a batch writing a run as its own and a
-- batch delivering to it never both hold rows. What is left is deliveries against deliveries: a
-- batch waking two or more runs locks them in one global order, and a batch waking one run holds
-- no other woken row. A batch without deliveries (step commits, claims: a chain) reads the
-- waiters of its commits' runs (an index probe each, as each commit does) and locks no row early.
--
-- Not covered (PostgreSQL breaks such a deadlock and the writer runs the batch again, as before):
-- runs woken by admission hand-offs (found under a gate's lock), a task result for a run whose
-- wait is gone, and patches of runs without waiters.
--
-- The two-argument `apply` stays as version 8 left it, for engines of older builds still
-- running while a deployment is upgraded.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.

-- `p`: `{"probe": [run], "delete": [run], "keys": [[kind, key]], "buffers": [[workflow, key]],
-- "queue": bool, "tokens": [token], "events": [name], "task_runs": [run]}`, each optional.
CREATE FUNCTION __SCHEMA__.lock_batch(p jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_tokens text[] := ARRAY(SELECT jsonb_array_elements_text(p -> 'tokens'));
    v_events text[] := ARRAY(SELECT jsonb_array_elements_text(p -> 'events'));
    v_task_runs text[] := ARRAY(SELECT jsonb_array_elements_text(p -> 'task_runs'));
    v_targets text[];
BEGIN
    -- 1. Every advisory key, ascending (one statement: the locks are taken in the order the
    --    sorted keys are read).
    PERFORM pg_advisory_xact_lock(s.k) FROM (SELECT DISTINCT k FROM (
        WITH RECURSIVE doomed (id, path) AS (
            SELECT r.id, ARRAY[r.id] FROM __SCHEMA__.runs AS r
             WHERE r.id = ANY (ARRAY(SELECT jsonb_array_elements_text(p -> 'delete')))
            UNION ALL
            SELECT r.id, d.path || r.id FROM __SCHEMA__.runs AS r JOIN doomed AS d ON r.parent_id = d.id
             WHERE NOT (r.id = ANY (d.path)))
        SELECT __SCHEMA__.lock_key(w.kind, w.key) AS k FROM __SCHEMA__.waiters AS w
         WHERE w.run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(p -> 'probe') UNION ALL SELECT d.id FROM doomed AS d))
        UNION ALL
        SELECT __SCHEMA__.lock_key(k ->> 0, k ->> 1) FROM jsonb_array_elements(p -> 'keys') AS k
        UNION ALL
        SELECT __SCHEMA__.lock_key('buffer', jsonb_build_array(b ->> 0, b ->> 1)::text)
          FROM jsonb_array_elements(p -> 'buffers') AS b
        UNION ALL
        SELECT __SCHEMA__.lock_key('queue', '') WHERE COALESCE((p ->> 'queue')::boolean, false)) AS all_keys
     ORDER BY k) AS s;

    -- 2. The runs the batch delivers to, when there are two or more: their rows, in id order.
    IF cardinality(v_tokens) + cardinality(v_task_runs) < 2 AND cardinality(v_events) = 0 THEN
        RETURN;
    END IF;
    v_targets := ARRAY(
        SELECT w.run_id FROM __SCHEMA__.waiters AS w WHERE w.kind = 'signal' AND w.key = ANY (v_tokens)
        UNION
        SELECT w.run_id FROM __SCHEMA__.waiters AS w WHERE w.kind = 'event' AND w.key = ANY (v_events)
        UNION
        SELECT unnest(v_task_runs));
    IF cardinality(v_targets) >= 2 THEN
        PERFORM count(*) FROM (SELECT r.id FROM __SCHEMA__.runs AS r WHERE r.id = ANY (v_targets)
                                ORDER BY r.id FOR UPDATE) AS l;
    END IF;
END
$$;

-- A batch with what it locks (`NULL` for one operation, which orders its own locks): `lock_batch`,
-- then the operations, as `apply` of version 8.
CREATE FUNCTION __SCHEMA__.apply(p_ops jsonb, p_channel text, p_locks jsonb) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    v_op jsonb;
BEGIN
    PERFORM set_config('durable.notify_channel', COALESCE(p_channel, ''), true);
    IF p_locks ?| ARRAY['delete', 'keys', 'buffers', 'queue', 'tokens', 'events', 'task_runs'] THEN
        PERFORM __SCHEMA__.lock_batch(p_locks);
    ELSIF p_locks ? 'probe' THEN
        -- Only runs to probe (step commits, patches without signals: a chain's batches): the keys
        -- of their waiters, ascending, and nothing else of `lock_batch`.
        PERFORM pg_advisory_xact_lock(s.k)
           FROM (SELECT DISTINCT __SCHEMA__.lock_key(w.kind, w.key) AS k FROM __SCHEMA__.waiters AS w
                  WHERE w.run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(p_locks -> 'probe')))
                  ORDER BY k) AS s;
    END IF;
    FOR v_op IN SELECT x FROM jsonb_array_elements(p_ops) WITH ORDINALITY AS t (x, i) ORDER BY i LOOP
        RETURN NEXT (CASE v_op ->> 'op'
            WHEN 'commit' THEN __SCHEMA__.commit(v_op)
            WHEN 'create_run' THEN __SCHEMA__.create_admitted(v_op -> 'run', v_op -> 'admission')
            WHEN 'create_runs' THEN __SCHEMA__.create_runs(v_op)
            WHEN 'claim_run' THEN __SCHEMA__.claim_run(v_op)
            WHEN 'renew_lease' THEN __SCHEMA__.renew_lease(v_op)
            WHEN 'release_lease' THEN __SCHEMA__.release_lease(v_op)
            WHEN 'update_run_if' THEN __SCHEMA__.update_run_if(v_op)
            WHEN 'send_signal' THEN jsonb_build_object('delivery',
                __SCHEMA__.send_signal(v_op ->> 'token', v_op ->> 'payload', (v_op ->> 'now')::bigint))
            WHEN 'complete_task' THEN __SCHEMA__.complete_task_admitted(v_op)
            WHEN 'publish' THEN __SCHEMA__.publish(v_op)
            WHEN 'flush_buffer' THEN __SCHEMA__.flush_buffer(v_op)
            WHEN 'save_schedule' THEN __SCHEMA__.save_schedule(v_op)
            WHEN 'delete_schedule' THEN __SCHEMA__.delete_schedule(v_op)
            WHEN 'delete_run' THEN __SCHEMA__.delete_run(v_op)
            WHEN 'acquire_slot' THEN __SCHEMA__.acquire_slot(v_op)
            WHEN 'release_slot' THEN __SCHEMA__.release_slot(v_op)
            WHEN 'enqueue' THEN __SCHEMA__.enqueue(v_op)
            WHEN 'ack_queued' THEN __SCHEMA__.ack_queued(v_op)
            WHEN 'release_queued' THEN __SCHEMA__.release_queued(v_op)
            ELSE jsonb_build_object('err', 'unknown_op', 'message', format('unknown operation %s', v_op ->> 'op'))
        END)::text;
    END LOOP;
END
$$;
