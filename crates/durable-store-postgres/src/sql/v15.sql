-- durable-store-postgres, schema version 15: a step's commit in two statements, and no
-- SQL-language function planned again at every call.
--
-- Measured on PostgreSQL 15 with 3 worker processes running `chain` (1,000 runs of 5 no-op steps),
-- the server's backends used about 70% of the machine's CPU, the engines about 12%: server work
-- per write bounds throughput. Of it (perf, by function):
-- - `commit` of a step (one checkpoint, nothing else) took about 60 us of server time in a loop
--   calling it directly: the probe of the run's waiters (for their advisory keys), the lease-check
--   `UPDATE`, the checkpoint `INSERT … SELECT DISTINCT ON … ORDER BY` over the JSON array, a dozen
--   JSON tests of fields that are empty, and `admission_runs` of an empty list.
-- - A `LANGUAGE sql` function that the planner cannot inline (its body has a `FROM`, or is an
--   `UPDATE`) is parsed, analysed and planned again at every call from PL/pgSQL (PostgreSQL before
--   18 keeps no plan of it across calls): `fmgr_sql` with its parser and planner was about a tenth
--   of the backends' time. `admission_runs` ran at the end of every commit, `finish_tasks_of` at
--   every settle, `admission_save` at every admission change.
--
-- Now:
-- - `step_commit` is the commit of a turn that made one checkpoint and nothing else (no end, no
--   waits, no expired waits, no state, no children, no signals, no tasks, no released slots):
--   the lease-check `UPDATE` of the run row, then the checkpoint's upsert, about 30 us. It takes
--   no advisory key: it touches no waiter and no token, and takes no lock after the run row
--   (a delivery to the run takes its token's key, then the run row: no cycle). The client sends
--   it for such commits (`ops::Op::StepCommit`) and names no waiters to probe for them in the
--   batch's locks. Its answer is `commit`'s.
-- - The three functions above are PL/pgSQL (whose plans are kept per session); `admission_runs`
--   answers an empty list at once.
--
-- Every function here is created or replaced: running this file again is harmless.
--
-- A template, like v1.sql: `__SCHEMA__` is replaced by the quoted schema name.

-- A step's commit: `{"op": "step_commit", "run", "owner", "now", "checkpoint"}`; `commit`'s answer.
CREATE OR REPLACE FUNCTION __SCHEMA__.step_commit(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_run text := p ->> 'run';
    v_cp jsonb := p -> 'checkpoint';
BEGIN
    -- The lease check, as `commit` makes it for a commit without an end: progress of a running
    -- run resets its recovery count.
    UPDATE __SCHEMA__.runs AS r
       SET updated_at = (p ->> 'now')::bigint,
           recovery_attempts = CASE WHEN r.status = 'running' THEN 0 ELSE r.recovery_attempts END
     WHERE r.id = v_run AND r.lease_owner = p ->> 'owner';
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM __SCHEMA__.runs AS r WHERE r.id = v_run) THEN
            RETURN jsonb_build_object('err', 'lease_lost');
        END IF;
        RETURN jsonb_build_object('err', 'not_found');
    END IF;
    INSERT INTO __SCHEMA__.checkpoints AS c (run_id, seq, name, kind, status, input, output, error, attempts,
                                             wake_at, started_at, updated_at)
    VALUES (v_run, (v_cp ->> 'seq')::bigint, v_cp ->> 'name', v_cp ->> 'kind', v_cp ->> 'status', v_cp ->> 'input',
            v_cp ->> 'output', v_cp ->> 'error', (v_cp ->> 'attempts')::bigint, (v_cp ->> 'wake_at')::bigint,
            (v_cp ->> 'started_at')::bigint, (v_cp ->> 'updated_at')::bigint)
    ON CONFLICT (run_id, seq) DO UPDATE
        SET name = excluded.name, kind = excluded.kind, status = excluded.status, input = excluded.input,
            output = excluded.output, error = excluded.error, attempts = excluded.attempts,
            wake_at = excluded.wake_at, started_at = excluded.started_at, updated_at = excluded.updated_at;
    RETURN '{"woken": false, "settled": false, "deliveries": [], "raced": [], "handed_off": []}'::jsonb;
END
$$;

-- `apply` of version 12, with `step_commit`.
CREATE OR REPLACE FUNCTION __SCHEMA__.apply(p_ops jsonb, p_channel text, p_locks jsonb) RETURNS SETOF text
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
            WHEN 'step_commit' THEN __SCHEMA__.step_commit(v_op)
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

-- The run ids of hand-offs, in order (version 8's, in PL/pgSQL).
CREATE OR REPLACE FUNCTION __SCHEMA__.admission_runs(p_handed jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_handed = '[]'::jsonb THEN
        RETURN p_handed;
    END IF;
    RETURN (SELECT COALESCE(jsonb_agg(x -> 'run_id' ORDER BY i), '[]'::jsonb)
              FROM jsonb_array_elements(p_handed) WITH ORDINALITY AS t (x, i));
END
$$;

-- Finishes the unfinished tasks of a run that settled (outcome `cancelled`); version 7's, in
-- PL/pgSQL.
CREATE OR REPLACE FUNCTION __SCHEMA__.finish_tasks_of(p_run text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE __SCHEMA__.tasks SET state = 'finished', outcome = 'cancelled', lease_until = NULL
     WHERE run_id = p_run AND state <> 'finished';
END
$$;

-- Stores a gate's record (its row is locked); version 8's, in PL/pgSQL.
CREATE OR REPLACE FUNCTION __SCHEMA__.admission_save(p_g __SCHEMA__.admission_gates) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE __SCHEMA__.admission_gates
       SET limits = p_g.limits, next_ticket = p_g.next_ticket, round = p_g.round, window_start = p_g.window_start,
           window_count = p_g.window_count, touched = p_g.touched
     WHERE gate = p_g.gate;
END
$$;
